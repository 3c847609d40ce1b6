# The costs of the slowest discovered GoogleTest tests (seconds, Release,
# idle machine), read by ctest after their discovery (TEST_INCLUDE_FILES; see
# CMakeLists.txt for why). Names not found are ignored.
# Under AddressSanitizer the Qwen-vocabulary walk takes ten times its
# Release time (515 s on an idle Zen 4): past the 600 s default on a slower host.
set_tests_properties(StructuredMask.QwenVocabularyWalksAreValidAndMasksExact PROPERTIES COST 50 TIMEOUT 1800)
set_tests_properties(ServeStructured.JsonObjectRepliesAreObjects PROPERTIES COST 31)
set_tests_properties(StructuredEngine.EveryCorpusSchemaValidatesAtTemperatureZeroAndOne PROPERTIES COST 19)
set_tests_properties(Engine.QuantizedGreedyTextAloneAndBatched PROPERTIES COST 9)
set_tests_properties(Moe.ForwardMatchesDoublePrecisionReference PROPERTIES COST 9)
set_tests_properties(Moe.ForwardMatchesDoublePrecisionReference.classes PROPERTIES COST 9)
set_tests_properties(Forward.KQuantsMatchReference PROPERTIES COST 9)
set_tests_properties(Forward.KQuantsMatchReference.classes PROPERTIES COST 9)
set_tests_properties(Engine.RandomizedAgainstAlone PROPERTIES COST 7)
set_tests_properties(StructuredMask.MaskEqualsBruteForceOnEveryStateOfCorpusWalks PROPERTIES COST 5)
