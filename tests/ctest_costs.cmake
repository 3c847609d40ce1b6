# The costs of the slowest discovered GoogleTest tests (seconds, Release,
# idle machine), read by ctest after their discovery (TEST_INCLUDE_FILES; see
# CMakeLists.txt for why). Names not found are ignored.
set_tests_properties(StructuredMask.QwenVocabularyWalksAreValidAndMasksExact PROPERTIES COST 50)
set_tests_properties(Engine.QuantizedGreedyTextAloneAndBatched PROPERTIES COST 9)
set_tests_properties(Moe.ForwardMatchesDoublePrecisionReference PROPERTIES COST 9)
set_tests_properties(Moe.ForwardMatchesDoublePrecisionReference.classes PROPERTIES COST 9)
set_tests_properties(Forward.KQuantsMatchReference PROPERTIES COST 9)
set_tests_properties(Forward.KQuantsMatchReference.classes PROPERTIES COST 9)
set_tests_properties(Engine.RandomizedAgainstAlone PROPERTIES COST 7)
set_tests_properties(StructuredMask.MaskEqualsBruteForceOnEveryStateOfCorpusWalks PROPERTIES COST 5)
