// A grammar compiled for matching bytes: a pushdown automaton whose states
// are the states of one DFA per rule.
//
// Each rule becomes an NFA (Thompson construction over UTF-8 bytes) in which
// the rules that cannot reach themselves are inlined, so only recursion (and
// rules too large to copy) remains as calls; each remaining rule's NFA is then
// determinized over byte classes plus one symbol per callee. A parse position
// is a stack of nodes (global DFA state ids): the top is where the current
// rule is, the others are where their rules resume after the call returns.
// Ambiguity across rules is kept as a set of stacks; inside a rule there is
// none (the DFA). Left recursion is refused at compile time, so closing over
// calls and returns always terminates.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "structured/grammar.h"

namespace minfer::structured {

struct CompiledGrammar {
    struct Node {
        int32_t rule = -1;
        bool final = false;      // the rule may end here
        bool has_bytes = false;  // some byte leads on
        // (callee's start node, node this rule resumes at after the callee)
        std::vector<std::pair<int32_t, int32_t>> calls;
    };
    std::array<uint8_t, 256> byte_class{};  // byte -> class
    int32_t n_classes = 0;
    std::vector<Node> nodes;
    std::vector<int32_t> next;  // [n_nodes * n_classes] next node or -1
    int32_t root_start = -1;
    std::vector<std::string> rule_names;  // [rules of the source grammar]
    // [n_nodes] equivalent_node_classes: nodes of one class share a token mask.
    std::vector<int32_t> node_class;
    int32_t n_node_classes = 0;
    // [n_nodes] short_token_classes(kShortTokenBytes): nodes of one class
    // share the mask of the tokens of at most that many bytes.
    std::vector<int32_t> short_class;
    int32_t n_short_classes = 0;

    int32_t step(int32_t node, uint8_t byte) const {
        return next[size_t(node) * size_t(n_classes) + byte_class[byte]];
    }
};

// Throws minfer::Error on left recursion or a rule that can never finish
// (both naming the rule), or a grammar whose automaton exceeds the size limit.
CompiledGrammar compile_grammar(const Grammar& g);

// Nodes that behave alike from any stack get the same class: the same final
// flag, the same calls (callee start and resume node alike) and, byte class
// by byte class, successors alike (Moore's partition refinement: the coarsest
// such partition). Rule ids do not count: matching never reads them. Inlined
// copies of a rule that continue alike (every JSON string value's body before
// the same closing text, say) fall into one class, so a token mask computed
// for one node holds for the whole class. Returns [n_nodes] class ids, dense
// from 0.
std::vector<int32_t> equivalent_node_classes(const CompiledGrammar& g);

// The length that splits a vocabulary into short tokens, whose masks are
// shared by short_class, and long ones, whose masks are shared by node_class.
inline constexpr int kShortTokenBytes = 16;

// Nodes that take every byte string of at most `k` bytes alike get the same
// class: the same final flag and calls (by equivalent_node_classes, in
// g.node_class), and successors alike for k - 1 more bytes (k rounds of the
// refinement). A token of at most k bytes, walked from either node, is then
// accepted, refused, or left to the rules below at the same offsets, so its
// place in a token mask is the same. Coarser than node_class where nodes
// differ only further on: the positions of a bounded string (`maxLength`)
// with at least k bytes of room left are one class here but a chain of
// classes in node_class. Needs g.node_class; returns [n_nodes] class ids,
// dense from 0.
std::vector<int32_t> short_token_classes(const CompiledGrammar& g, int k);

// Parse positions. An empty stack is a finished parse (the root rule
// returned). A set is kept sorted and without duplicates, and every non-empty
// stack's top node has bytes to take (calls and returns are closed over).
using Stack = std::vector<int32_t>;
using StackSet = std::vector<Stack>;

// The closed set of the positions the root rule starts in.
StackSet initial_stacks(const CompiledGrammar& g);
// Closes `s` over calls and returns and appends the results to `out` (not
// normalized: call normalize_stacks after the last append).
void close_stack(const CompiledGrammar& g, Stack s, StackSet& out);
void normalize_stacks(StackSet& s);
// The positions after `byte`; false (and `out` empty) when no stack takes it.
bool advance_stacks(const CompiledGrammar& g, const StackSet& in, uint8_t byte, StackSet& out);

}  // namespace minfer::structured
