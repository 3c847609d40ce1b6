#include "ir/ir.h"

#include <atomic>
#include <deque>

#include "util/error.h"

namespace minfer::graph {

uint64_t Graph::next_uid() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

std::string_view op_name(Op op) {
    switch (op) {
        case Op::Input:
            return "Input";
        case Op::GetRows:
            return "GetRows";
        case Op::SelectRows:
            return "SelectRows";
        case Op::RmsNorm:
            return "RmsNorm";
        case Op::MatMul:
            return "MatMul";
        case Op::Add:
            return "Add";
        case Op::AddBias:
            return "AddBias";
        case Op::Mul:
            return "Mul";
        case Op::Silu:
            return "Silu";
        case Op::SwiGLU:
            return "SwiGLU";
        case Op::MatMulSwiGLU:
            return "MatMulSwiGLU";
        case Op::HeadNorm:
            return "HeadNorm";
        case Op::Rope:
            return "Rope";
        case Op::KvStore:
            return "KvStore";
        case Op::Attn:
            return "Attn";
        case Op::FusedQKV:
            return "FusedQKV";
        case Op::QkvBiasRopeStore:
            return "QkvBiasRopeStore";
        case Op::Softmax:
            return "Softmax";
        case Op::TopK:
            return "TopK";
        case Op::MoeWeights:
            return "MoeWeights";
        case Op::MoeGroup:
            return "MoeGroup";
        case Op::MoeGather:
            return "MoeGather";
        case Op::MatMulId:
            return "MatMulId";
        case Op::MatMulIdSwiGLU:
            return "MatMulIdSwiGLU";
        case Op::MoeSum:
            return "MoeSum";
        case Op::SigmoidScale:
            return "SigmoidScale";
    }
    return "?";
}

size_t Node::nbytes() const {
    return tensor::row_size(type, ne[0]) * static_cast<size_t>(ne[1] * ne[2] * ne[3]);
}

NodeId Graph::add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<NodeId>(nodes.size() - 1);
}

NodeId Graph::add_input(std::string name, int64_t n) {
    Node node;
    node.op = Op::Input;
    node.name = std::move(name);
    node.type = tensor::DType::I32;
    node.ne = {n, 1, 1, 1};
    NodeId id = add(std::move(node));
    inputs.push_back(id);
    return id;
}

NodeId Graph::find(std::string_view name) const {
    for (size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].name == name) return static_cast<NodeId>(i);
    return -1;
}

std::vector<int32_t> Graph::n_consumers() const {
    std::vector<int32_t> c(nodes.size(), 0);
    for (const auto& n : nodes)
        for (NodeId s : n.src)
            if (s >= 0 && static_cast<size_t>(s) < nodes.size()) ++c[static_cast<size_t>(s)];
    return c;
}

std::vector<NodeId> Graph::topo_order() const {
    const size_t n = nodes.size();
    std::vector<int32_t> indegree(n, 0);
    std::vector<std::vector<NodeId>> consumers(n);
    for (size_t i = 0; i < n; ++i) {
        for (NodeId s : nodes[i].src) {
            if (s < 0 || static_cast<size_t>(s) >= n)
                throw Error("graph: node " + std::to_string(i) + " ('" + nodes[i].name +
                            "') has source id " + std::to_string(s) + " out of range");
            ++indegree[i];
            consumers[static_cast<size_t>(s)].push_back(static_cast<NodeId>(i));
        }
    }
    std::deque<NodeId> ready;
    for (size_t i = 0; i < n; ++i)
        if (indegree[i] == 0) ready.push_back(static_cast<NodeId>(i));
    std::vector<NodeId> order;
    order.reserve(n);
    while (!ready.empty()) {
        NodeId id = ready.front();
        ready.pop_front();
        order.push_back(id);
        for (NodeId c : consumers[static_cast<size_t>(id)])
            if (--indegree[static_cast<size_t>(c)] == 0) ready.push_back(c);
    }
    if (order.size() != n) {
        for (size_t i = 0; i < n; ++i)
            if (indegree[i] > 0)
                throw Error("graph: cycle through node " + std::to_string(i) + " ('" +
                            nodes[i].name + "')");
    }
    return order;
}

}  // namespace minfer::graph
