#include "families/gemm/config.h"

#include <cstdint>
#include <regex>

namespace fact::realize {

std::string GemmConfig::name() const {
  auto sched = [](const std::string& s) {
    if (s == "cooperative") return std::string("coop");
    if (s == "pingpong") return std::string("pp");
    if (s == "tma_cooperative") return std::string("tmacoop");
    if (s == "multistage") return std::string("ms");
    if (s == "visitor") return std::string("evt");
    return s;
  };
  std::string n = "t" + std::to_string(tile_m) + "x" + std::to_string(tile_n) + "x" + std::to_string(tile_k) +
                  "_c" + std::to_string(cluster_m) + "x" + std::to_string(cluster_n) + "_" +
                  sched(kernel_schedule) + "_" + sched(epilogue_schedule) + "_s" +
                  (stages == 0 ? std::string("auto") : std::to_string(stages)) + "_" + tile_scheduler;
  if (math != "default") n += "_" + math;
  return n;
}

bool GemmConfig::is_name(const std::string& text) {
  static const std::regex shape(
      "t[0-9]+x[0-9]+x[0-9]+_c[0-9]+x[0-9]+_(coop|pp|ms)_(tmacoop|tma|evt)_s(auto|[0-9]+)_(persistent|stream_k|grid|group)"
      "(_(tf32|3xtf32))?");
  return std::regex_match(text, shape);
}

nlohmann::json GemmConfig::to_json() const {
  return {{"name", name()},
          {"tile", {tile_m, tile_n, tile_k}},
          {"cluster", {cluster_m, cluster_n}},
          {"kernel_schedule", kernel_schedule},
          {"epilogue_schedule", epilogue_schedule},
          {"stages", stages},
          {"tile_scheduler", tile_scheduler},
          {"math", math}};
}

GemmConfig GemmConfig::from_json(const nlohmann::json& j) {
  GemmConfig c;
  c.tile_m = j.at("tile").at(0);
  c.tile_n = j.at("tile").at(1);
  c.tile_k = j.at("tile").at(2);
  c.cluster_m = j.at("cluster").at(0);
  c.cluster_n = j.at("cluster").at(1);
  c.kernel_schedule = j.at("kernel_schedule");
  c.epilogue_schedule = j.at("epilogue_schedule");
  c.stages = j.value("stages", 0);
  c.tile_scheduler = j.value("tile_scheduler", std::string("persistent"));
  c.math = j.value("math", std::string("default"));
  return c;
}

std::pair<int, int> multistage_warps(const GemmConfig& c) {
  if (int64_t{c.tile_m} * c.tile_n < 16384) return {2, 2};
  return c.tile_m >= c.tile_n ? std::pair{4, 2} : std::pair{2, 4};
}

std::string LaunchKnobs::name() const {
  const std::string r = raster == "heuristic" ? "heur" : raster == "along_m" ? "m" : "n";
  return "r_" + r + "_s" + std::to_string(max_swizzle) + "_k" + std::to_string(splits) +
         (reduction == "nondeterministic" ? "_nd" : "") +
         (decomposition == "stream_k" ? "_sk" : decomposition == "data_parallel" ? "_dp" : "");
}

nlohmann::json LaunchKnobs::to_json() const {
  nlohmann::json j = {{"raster", raster}, {"max_swizzle", max_swizzle}, {"splits", splits}};
  if (reduction != "deterministic") j["reduction"] = reduction;
  if (decomposition != "heuristic") j["decomposition"] = decomposition;
  return j;
}

}  // namespace fact::realize
