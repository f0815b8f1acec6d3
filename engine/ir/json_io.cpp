#include "ir/json_io.h"

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ir/error.h"
#include "ir/validate.h"

namespace fact::ir {
namespace {

using json = nlohmann::json;

struct Loader {
  std::string origin;
  Graph g;

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw UserError(origin + ": " + where + ": " + what);
  }

  static std::string where_node(const std::string& name) { return "node '" + name + "'"; }

  // PyTorch's other dtypes, as the tracer spells those FACT has no short name for.
  static bool is_torch_dtype_name(const std::string& s) {
    static const std::set<std::string> names = {
        "float64", "float32", "float16", "bfloat16", "complex32", "complex64", "complex128", "int64", "int32",
        "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e4m3fnuz",
        "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "quint8", "qint32",
        "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "int1", "int2", "int3",
        "int4", "int5", "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7"};
    return names.count(s) > 0;
  }

  // Names are what torch.export writes (letters, digits, '_'; targets add '.' between module
  // attributes): anything else (a newline, a quote, a comment marker) is refused here, so no
  // later stage, emitted source or message carries such text.
  void check_name(const std::string& text, const std::string& where, const char* what) {
    const bool ok = !text.empty() && text.size() <= 512 && std::all_of(text.begin(), text.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
             ch == '.' || ch == '-';
    });
    if (!ok) {
      std::string shown;
      for (char ch : text.substr(0, 60)) {
        shown += (ch >= 0x20 && ch < 0x7f && ch != '\\') ? std::string(1, ch) : "?";
      }
      fail(where, std::string("has a ") + what + " ('" + shown + (text.size() > 60 ? "...'" : "'") +
                      ") that is not 1 to 512 letters, digits, '_', '.' or '-'; names are torch.export's, "
                      "so re-trace the module with `fact trace` rather than editing them");
    }
  }

  Arg parse_arg(const json& j, const std::string& where) {
    Arg a;
    if (j.is_null()) return a;
    if (j.is_boolean()) {
      a.kind = Arg::Kind::boolean;
      a.b = j.get<bool>();
    } else if (j.is_number_integer()) {
      a.kind = Arg::Kind::integer;
      a.i = j.get<int64_t>();
    } else if (j.is_number()) {
      a.kind = Arg::Kind::real;
      a.f = j.get<double>();
    } else if (j.is_string()) {
      a.kind = Arg::Kind::string;
      a.s = j.get<std::string>();
    } else if (j.is_array()) {
      a.kind = Arg::Kind::list;
      for (const auto& item : j) a.items.push_back(parse_arg(item, where));
    } else if (j.is_object()) {
      if (j.contains("node")) {
        if (!j["node"].is_string()) fail(where, "a node reference must name a node: " + j.dump());
        const auto ref = j["node"].get<std::string>();
        auto id = g.find(ref);
        if (!id) {
          fail(where, "refers to node '" + ref +
                          "', which is not defined before it (nodes must be in program order)");
        }
        a.kind = Arg::Kind::node;
        a.node = *id;
        if (j.contains("output")) a.output = j["output"].get<int>();
        const auto& src = g.nodes[static_cast<size_t>(*id)];
        if (a.output < 0 || static_cast<size_t>(a.output) >= std::max<size_t>(src.outputs.size(), 1)) {
          fail(where, "refers to output " + std::to_string(a.output) + " of node '" + ref +
                          "', which has " + std::to_string(src.outputs.size()) + " outputs");
        }
      } else if (j.contains("float")) {
        a.kind = Arg::Kind::real;
        const auto v = j["float"].get<std::string>();
        if (v == "inf") {
          a.f = std::numeric_limits<double>::infinity();
        } else if (v == "-inf") {
          a.f = -std::numeric_limits<double>::infinity();
        } else if (v == "nan") {
          a.f = std::numeric_limits<double>::quiet_NaN();
        } else {
          fail(where, "unknown float spelling '" + v + "' (expected inf, -inf or nan)");
        }
      } else if (j.contains("symbol")) {
        a.kind = Arg::Kind::symbol;
        a.s = j["symbol"].get<std::string>();
      } else if (j.contains("repr")) {
        a.kind = Arg::Kind::other;
        a.s = j["repr"].get<std::string>();
      } else {
        for (const char* tag : {"dtype", "device", "layout", "memory_format"}) {
          if (j.contains(tag)) {
            a.kind = Arg::Kind::enum_value;
            a.tag = tag;
            a.s = j[tag].get<std::string>();
            return a;
          }
        }
        fail(where, "unknown argument value " + j.dump());
      }
    }
    return a;
  }

  TensorType parse_type(const json& j, const std::string& where) {
    if (!j.is_object()) fail(where, "a tensor type must be an object, got " + j.dump());
    if (j.contains("value")) {  // a non-tensor result (a Python int): no tensor type
      TensorType t;
      t.dtype = DType::i64;
      return t;
    }
    for (const char* key : {"dtype", "shape", "strides"}) {
      if (!j.contains(key)) fail(where, std::string("tensor type lacks \"") + key + "\"");
    }
    TensorType t;
    t.dtype_spelling = j["dtype"].get<std::string>();
    t.dtype = dtype_from_name(t.dtype_spelling).value_or(DType::other);
    if (t.dtype == DType::other && !is_torch_dtype_name(t.dtype_spelling)) {
      fail(where, "unknown dtype '" + t.dtype_spelling + "' (FACT's names: f64 f32 f16 bf16 f8e4m3 f8e5m2 i64 i32 "
                  "i16 i8 u8 bool c64 c128, or another of PyTorch's dtypes as PyTorch names it)");
    }
    if (j["strides"].is_null()) {
      fail(where, "has a tensor without strides (a sparse or other non-strided layout); FACT "
                  "handles dense tensors only: convert with .to_dense() before tracing");
    }
    for (const char* key : {"shape", "strides"}) {
      const auto& dims = j[key];
      if (!dims.is_array()) fail(where, std::string("\"") + key + "\" must be a list");
      for (size_t d = 0; d < dims.size(); ++d) {
        if (dims[d].is_string()) {
          fail(where, "has a dynamic dimension '" + dims[d].get<std::string>() + "' (" + key +
                          " " + std::to_string(d) +
                          "): FACT compiles kernels for static shapes; trace with fixed example "
                          "inputs and no dynamic_shapes");
        }
        if (!dims[d].is_number_integer()) {
          fail(where, std::string("\"") + key + "\" entry " + std::to_string(d) +
                          " is not an integer: " + dims[d].dump());
        }
        (std::string(key) == "shape" ? t.shape : t.strides).push_back(dims[d].get<int64_t>());
      }
    }
    return t;
  }

  void parse_node(const json& j, size_t index) {
    const std::string where_idx = "node #" + std::to_string(index);
    if (!j.is_object()) fail(where_idx, "must be an object");
    if (!j.contains("name") || !j["name"].is_string()) fail(where_idx, "has no \"name\"");
    Node n;
    n.name = j["name"].get<std::string>();
    check_name(n.name, where_idx, "name");
    const auto where = where_node(n.name);
    if (g.by_name.count(n.name)) fail(where, "is defined twice");
    if (!j.contains("op") || !j["op"].is_string()) fail(where, "has no \"op\"");
    n.target_op = j["op"].get<std::string>();
    n.op = op_from_target(n.target_op);
    const auto kind = j.value("kind", std::string(n.op == Op::placeholder ? "input" : "call"));
    static const std::map<std::string, NodeKind> kinds = {{"input", NodeKind::input},
                                                          {"parameter", NodeKind::parameter},
                                                          {"buffer", NodeKind::buffer},
                                                          {"constant", NodeKind::constant},
                                                          {"call", NodeKind::call}};
    auto k = kinds.find(kind);
    if (k == kinds.end()) {
      fail(where, "unknown kind '" + kind + "' (expected input, parameter, buffer, constant, call)");
    }
    n.kind = k->second;
    if ((n.op == Op::placeholder) != (n.kind != NodeKind::call)) {
      fail(where, "op '" + n.target_op + "' does not agree with kind '" + kind + "'");
    }
    n.target = j.value("target", std::string());
    if (!n.target.empty()) check_name(n.target, where, "target");
    n.module = j.value("module", std::string());
    if (j.contains("outputs")) {
      if (!j["outputs"].is_array()) fail(where, "\"outputs\" must be a list");
      for (const auto& t : j["outputs"]) n.outputs.push_back(parse_type(t, where));
    }
    if (j.contains("args")) {
      if (!j["args"].is_array()) fail(where, "\"args\" must be a list");
      for (const auto& a : j["args"]) n.args.push_back(parse_arg(a, where));
    }
    if (j.contains("kwargs")) {
      if (!j["kwargs"].is_object()) fail(where, "\"kwargs\" must be an object");
      for (const auto& [key, a] : j["kwargs"].items()) n.kwargs[key] = parse_arg(a, where);
    }
    if (j.contains("facts") && j["facts"].is_object()) {
      for (const auto& [key, v] : j["facts"].items()) {
        // Facts are argument values (docs/graph-format.md): booleans, numbers, {"float": "-inf"}.
        const Arg a = parse_arg(v, where);
        if (a.kind == Arg::Kind::boolean) {
          n.facts[key] = a.b ? 1.0 : 0.0;
        } else if (a.is_number()) {
          n.facts[key] = a.number();
        }
      }
    }
    n.id = static_cast<int>(g.nodes.size());
    g.by_name[n.name] = n.id;
    g.nodes.push_back(std::move(n));
  }

  Graph parse(const json& doc) {
    if (!doc.is_object()) fail("top level", "a FACT graph is a JSON object");
    if (doc.value("format", std::string()) != "fact.graph") {
      fail("top level", "not a FACT graph (\"format\" must be \"fact.graph\"); make one with "
                        "`fact trace problem.py -o graph.json`");
    }
    if (!doc.contains("version") || !doc["version"].is_number_integer()) {
      fail("top level", "has no integer \"version\"");
    }
    g.version = doc["version"].get<int>();
    if (g.version != kGraphFormatVersion) {
      fail("top level", "graph format version " + std::to_string(g.version) +
                            " is not supported (this engine reads version " +
                            std::to_string(kGraphFormatVersion) + "); re-trace with this FACT");
    }
    g.source = doc.value("source", std::string());
    g.model = doc.value("model", std::string());
    g.dtype = doc.value("dtype", std::string());
    g.precision = doc.value("float32_matmul_precision", std::string("highest"));
    g.torch_version = doc.value("torch_version", std::string());
    if (!doc.contains("nodes") || !doc["nodes"].is_array()) fail("top level", "has no \"nodes\" list");
    size_t index = 0;
    for (const auto& j : doc["nodes"]) parse_node(j, index++);
    if (!doc.contains("outputs") || !doc["outputs"].is_array()) {
      fail("top level", "has no \"outputs\" list");
    }
    for (const auto& o : doc["outputs"]) g.outputs.push_back(parse_arg(o, "graph outputs"));
    g.finalize();
    validate(g, origin);
    return std::move(g);
  }
};

}  // namespace

Graph load_graph_string(const std::string& text, const std::string& origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line 3, column 7: ..."
    auto pos = what.find("parse error");
    throw UserError(origin + ": malformed JSON (" + (pos == std::string::npos ? what : what.substr(pos)) +
                    "); is the file truncated? Re-create it with `fact trace`");
  } catch (const json::exception& e) {  // a number past double's range (1e999), ...
    std::string what = e.what();
    auto pos = what.find("] ");
    throw UserError(origin + ": unreadable JSON (" + (pos == std::string::npos ? what : what.substr(pos + 2)) +
                    "); re-create it with `fact trace`");
  }
  Loader loader{origin, {}};
  try {
    return loader.parse(doc);
  } catch (const json::exception& e) {
    throw UserError(origin + ": a field has the wrong type (" + std::string(e.what()) + ")");
  }
}

Graph load_graph_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    throw UserError(path + ": a folder, not a graph file (make one with `fact trace problem.py -o graph.json`)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open the graph file (does it exist?)");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) throw UserError(path + ": the graph file is empty");
  return load_graph_string(text.str(), path);
}

}  // namespace fact::ir
