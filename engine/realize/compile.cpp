#include "realize/compile.h"

#include <openssl/evp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "ir/error.h"
#include "families/gemm/emit.h"
#include "families/attention/attention.h"
#include "families/norm/norm.h"
#include "families/pointwise/pointwise.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace fact::realize {

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// How a compile ended: its exit status, or the signal that ended it, or the timeout.
struct Ended {
  int status = -1;  // exit status; -1 if it could not start or did not exit
  int signal = 0;   // the signal that killed it (an OOM killer's SIGKILL)
  bool timed_out = false;
};

// Run argv in a process group of its own with stdout+stderr to `log`; past `timeout_s` (0:
// none) the whole group is killed, so a hung nvcc (or its cicc, ptxas) never hangs realize.
Ended run_logged(const std::vector<std::string>& argv, const fs::path& log, double timeout_s) {
  Ended e;
  const pid_t pid = fork();
  if (pid < 0) return e;
  if (pid == 0) {
    setpgid(0, 0);
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::perror(args[0]);
    _exit(127);
  }
  setpgid(pid, pid);  // also here: whichever runs first
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return e;
    if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      e.timed_out = true;
      return e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (WIFEXITED(status)) e.status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  return e;
}

std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

std::string first_error_lines(const std::string& log, size_t max_lines = 4) {
  std::istringstream in(log);
  std::string line, out;
  size_t n = 0;
  while (std::getline(in, line) && n < max_lines) {
    if (line.find("error") == std::string::npos) continue;
    out += (n ? "\n" : "") + line;
    ++n;
  }
  return out.empty() ? log.substr(0, 400) : out;
}

}  // namespace

std::vector<std::string> ptxas_advisories(const std::string& log) {
  static const std::string kMark = "Potential Performance Loss: ";
  std::vector<std::string> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    const auto mark = line.find(kMark);
    if (mark == std::string::npos) continue;
    // "ptxas info    : (C7511) Potential Performance Loss: TEXT in the function '_Z...'"
    std::string code = "ptxas";
    const auto open = line.rfind("(C", mark);
    if (open != std::string::npos) {
      const auto close = line.find(')', open);
      if (close != std::string::npos && close < mark) code = line.substr(open + 1, close - open - 1);
    }
    std::string text = line.substr(mark + kMark.size());
    if (const auto fn = text.find(" in the function"); fn != std::string::npos) text.resize(fn);
    while (!text.empty() && (text.back() == '.' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
    const std::string advisory = code + ": " + text;
    if (std::find(out.begin(), out.end(), advisory) == out.end()) out.push_back(advisory);
  }
  return out;
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < len; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

std::string find_cutlass(const std::string& hint) {
  std::string dir = hint;
  if (dir.empty()) {
    if (const char* env = std::getenv("CUTLASS_DIR"); env && *env) dir = env;
  }
  if (dir.empty()) {
    throw UserError("CUTLASS not found: pass --cutlass-dir, set CUTLASS_DIR, or run ./setup.sh "
                    "(the nvidia-cutlass wheel ships the source; `fact` finds it)");
  }
  if (!fs::exists(fs::path(dir) / "include" / "cutlass" / "cutlass.h")) {
    throw UserError("'" + dir + "' does not hold CUTLASS (no include/cutlass/cutlass.h)");
  }
  return dir;
}

// The attention kernels ship as CUTLASS examples and are included from there: the Hopper FMHA
// (bf16, f16, f32 in TF32) or the sm80 memory-efficient attention (f32), by what the source
// includes.
static fs::path attention_example_dir(const std::string& cutlass_dir, const std::string& source) {
  const bool sm80 = source.find("\"kernel_forward.h\"") != std::string::npos;
  const char* example = sm80 ? "41_fused_multi_head_attention" : "88_hopper_fmha";
  const fs::path dir = fs::path(cutlass_dir) / "examples" / example;
  if (!fs::exists(sm80 ? dir / "kernel_forward.h" : dir / "kernel" / "fmha_kernel_builder.hpp")) {
    throw UserError("'" + cutlass_dir + "' has no examples/" + example + " (CUTLASS's " +
                    (sm80 ? "sm80 fused attention" : "Hopper FMHA") +
                    ", which attention kernels include): point CUTLASS_DIR at a full CUTLASS source tree such as "
                    "the nvidia-cutlass wheel's (./setup.sh finds it)");
  }
  return dir;
}

std::string tree_digest(const std::vector<std::filesystem::path>& roots) {
  namespace fs = std::filesystem;
  static std::mutex lock;
  static std::map<std::string, std::string> known;  // per process: the trees do not change
  std::string id;
  for (const auto& r : roots) id += fs::weakly_canonical(r).string() + "|";
  std::lock_guard<std::mutex> guard(lock);
  if (auto it = known.find(id); it != known.end()) return it->second;
  std::vector<std::pair<std::string, fs::path>> files;
  for (const auto& root : roots) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_regular_file()) files.emplace_back(fs::relative(it->path(), root).string(), it->path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& [rel, path] : files) all += rel + "\n" + sha256_hex(read_file(path)) + "\n";
  return known[id] = sha256_hex(all).substr(0, 16);
}

// A 64-bit little-endian ELF whose section header table (written last) lies within the bytes.
static bool whole_elf(const std::string& b) {
  if (b.size() < 64 || b.compare(0, 4, "\x7f" "ELF") != 0 || b[4] != 2 || b[5] != 1) return false;
  auto le = [&](size_t at, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
    return v;
  };
  const uint64_t shoff = le(0x28, 8), shentsize = le(0x3A, 2), shnum = le(0x3C, 2);
  return shoff > 0 && shoff + shentsize * shnum <= b.size();
}

std::string check_cached_library(const std::filesystem::path& entry) {
  namespace fs = std::filesystem;
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_file(entry / "meta.json"));
  } catch (const std::exception&) {
    return "has no readable meta.json";
  }
  if (!meta.contains("sha256") || !meta.contains("size")) {
    // Built before digests were kept: adopted when its ELF image is whole (the section table,
    // which comes last, lies within the file), with its digest recorded from now on.
    const std::string bytes = read_file(entry / "kernel.so");
    if (!whole_elf(bytes)) return "is not a whole shared library (truncated?)";
    meta["size"] = bytes.size();
    meta["sha256"] = sha256_hex(bytes);
    write_text_file(entry / "meta.json", meta.dump(2));
    return "";
  }
  std::error_code ec;
  const auto size = fs::file_size(entry / "kernel.so", ec);
  if (ec || size != meta["size"].get<uint64_t>()) {
    return "is " + (ec ? std::string("unreadable") : std::to_string(size) + " bytes") + ", not the " +
           std::to_string(meta["size"].get<uint64_t>()) + " it was built with";
  }
  if (sha256_hex(read_file(entry / "kernel.so")) != meta["sha256"].get<std::string>()) {
    return "does not match the digest it was built with";
  }
  return "";
}

std::string cutlass_version(const std::string& cutlass_dir) {
  const auto text = read_file(fs::path(cutlass_dir) / "include" / "cutlass" / "version.h");
  std::string v;
  for (const char* part : {"MAJOR", "MINOR", "PATCH"}) {
    std::smatch m;
    const std::regex re(std::string("#define CUTLASS_") + part + " ([0-9]+)");
    v += (v.empty() ? "" : ".") + (std::regex_search(text, m, re) ? m[1].str() : std::string("?"));
  }
  return v;
}

std::string nvcc_version(const std::string& nvcc) {
  const auto out = capture(nvcc + " --version 2>/dev/null");
  const auto pos = out.find("release ");
  if (pos == std::string::npos) {
    throw UserError("cannot run '" + nvcc + " --version': install the CUDA toolkit and put its nvcc on PATH "
                    "(`fact-engine realize` also takes --nvcc PATH)");
  }
  return out.substr(pos, out.find('\n', pos) - pos);
}

std::string default_cache_dir() {
  if (const char* p = std::getenv("FACT_CACHE_DIR"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "fact" / "kernels").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "fact" / "kernels").string();
  return ".fact-cache/kernels";
}

std::vector<std::string> nvcc_flags(const CompileOptions& opt) {
  FACT_CHECK(opt.arch == "sm90", "only sm90 kernels are emitted so far");
  return {"-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-gencode", "arch=compute_90a,code=sm_90a",
          "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden", "-shared", "-lineinfo"};
}

int sweep_abandoned_builds(const std::string& cache_dir, std::chrono::seconds min_age) {
  static const std::regex name(R"(\.tmp-[0-9a-f]{64}-([0-9]{1,9}))");
  int removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  // Housekeeping never fails a compile: every filesystem call takes an error code (another
  // process may be sweeping or publishing the same folders).
  for (fs::directory_iterator it(cache_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string base = it->path().filename().string();
    if (!std::regex_match(base, m, name)) continue;
    const pid_t pid = static_cast<pid_t>(std::strtol(m[1].str().c_str(), nullptr, 10));
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to ask)
    std::error_code tec;
    fs::file_time_type newest = fs::last_write_time(it->path(), tec);
    for (fs::directory_iterator f(it->path(), tec), fend; !tec && f != fend; f.increment(tec)) {
      std::error_code fec;
      const auto t = fs::last_write_time(f->path(), fec);
      if (!fec) newest = std::max(newest, t);
    }
    if (tec || now - newest < min_age) continue;
    fs::remove_all(it->path(), tec);
    if (!tec) ++removed;
  }
  return removed;
}

double default_compile_timeout() {
  if (const char* v = std::getenv("FACT_COMPILE_TIMEOUT"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end && *end == '\0' && s >= 0) return s;
    throw UserError(std::string("FACT_COMPILE_TIMEOUT='") + v + "' is not a number of seconds (0: no timeout)");
  }
  return 1800;
}

CacheReport check_cache(const std::string& dir_in, bool clean) {
  const std::string dir = dir_in.empty() ? default_cache_dir() : dir_in;
  CacheReport r;
  std::ostringstream out;
  if (!fs::is_directory(dir)) {
    out << "kernel cache " << dir << ": no such folder (nothing cached yet)\n";
    r.text = out.str();
    return r;
  }
  static const std::regex entry_name("[0-9a-f]{64}");
  std::vector<fs::path> entries;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  std::sort(entries.begin(), entries.end());
  for (const auto& path : entries) {
    const std::string name = path.filename().string();
    if (std::regex_match(name, entry_name) && fs::exists(path / "kernel.so")) {
      const std::string why = check_cached_library(path);
      if (why.empty()) {
        ++r.ok;
        continue;
      }
      ++r.damaged;
      out << "damaged: " << path.string() << " (" << why << ")\n";
      if (clean) {
        fs::remove_all(path, ec);
        r.removed += ec ? 0 : 1;
      }
    } else if (clean && name.rfind("failed-", 0) == 0) {
      fs::remove_all(path, ec);
      r.removed += ec ? 0 : 1;
    }
  }
  if (clean) r.removed += sweep_abandoned_builds(dir, std::chrono::seconds(0));
  out << "kernel cache " << dir << ": " << r.ok << " kernels ok, " << r.damaged << " damaged";
  if (clean) out << ", " << r.removed << " folders removed";
  else if (r.damaged) out << " (`fact cache clean` removes them; the next realize builds them again)";
  out << "\n";
  r.text = out.str();
  return r;
}

int default_compile_jobs(size_t kernels, unsigned cores) {
  const size_t c = std::max(1u, cores);
  // Compiles of one run take about as long as each other (a CUTLASS kernel, a minute or so), and
  // one cannot be split: 18 of them on 16 workers take two rounds, where 18 at once on 16 cores
  // take 18/16 of one. So up to one and a half times the cores run at once (nvcc is
  // single-threaded; memory holds that many on the machines FACT targets), beyond that one a core.
  return static_cast<int>(kernels <= c + c / 2 ? std::max<size_t>(kernels, 1) : c);
}

std::vector<CompileResult> compile_all(const std::vector<CompileJob>& jobs, const CompileOptions& opt_in) {
  CompileOptions opt = opt_in;
  opt.cutlass_dir = find_cutlass(opt.cutlass_dir);
  if (opt.cache_dir.empty()) opt.cache_dir = default_cache_dir();
  std::error_code ec;
  fs::create_directories(opt.cache_dir, ec);
  if (ec || !fs::is_directory(opt.cache_dir)) {
    throw UserError("kernel cache " + opt.cache_dir + ": cannot create it (" + ec.message() +
                    "); point FACT_CACHE_DIR or --cache-dir at a writable folder");
  }
  sweep_abandoned_builds(opt.cache_dir, std::chrono::hours(1));
  const auto flags = nvcc_flags(opt);
  // What makes the kernel is in the key, problem sizes and machine-specific paths never: the
  // source, nvcc's release and environment flags, CUTLASS's version and the content of its
  // headers (not where the tree lies, so a cache moves between machines), arch and flags. The
  // host compiler builds only the C ABI's glue around the device code, so it is not in the key.
  std::string salt = nvcc_version(opt.nvcc) + "|cutlass " + cutlass_version(opt.cutlass_dir) + " " +
                     tree_digest({fs::path(opt.cutlass_dir) / "include", fs::path(opt.cutlass_dir) / "tools" / "util" / "include"}) +
                     "|" + opt.arch + "|" + abi_header_text();
  for (const char* env : {"NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"}) {
    if (const char* v = std::getenv(env)) salt += std::string("|") + env + "=" + v;
  }
  for (const auto& f : flags) salt += "|" + f;

  std::vector<CompileResult> results(jobs.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::mutex print;
  // One kernel: build, publish into the cache, or keep the failure. Never throws: a worker
  // thread that threw would end the process.
  auto compile_one = [&](const CompileJob& job, CompileResult& r) {
    try {
      r.name = job.name;
      // Headers only some kernels include count only for those (the GEMM keys stay as they were).
      const bool norm = job.source.find("\"fact_norm_abi.h\"") != std::string::npos;
      const bool attention = job.source.find("\"fact_attention_abi.h\"") != std::string::npos;
      const bool pointwise = job.source.find("\"fact_pointwise_abi.h\"") != std::string::npos;
      r.key = sha256_hex(salt + (norm ? std::string("|") + norm_abi_header_text() : "") +
                         (attention ? std::string("|") + attention_abi_header_text() + "|" +
                                          tree_digest({attention_example_dir(opt.cutlass_dir, job.source)})
                                    : "") +
                         (pointwise ? std::string("|") + pointwise_abi_header_text() : "") + "|" + job.source);
      const fs::path entry = fs::path(opt.cache_dir) / r.key;
      r.library = (entry / "kernel.so").string();
      r.log = (entry / "build.log").string();
      const auto start = std::chrono::steady_clock::now();
      std::string damaged;
      if (fs::exists(entry / "kernel.so")) {
        damaged = check_cached_library(entry);
        if (damaged.empty()) {
          r.ok = r.cached = true;
        } else {  // truncated or altered since it was built: build it again
          std::error_code ec;
          fs::remove_all(entry, ec);
          if (!opt.quiet) {
            std::lock_guard<std::mutex> lock(print);
            std::cerr << "kernel cache: " << job.name << " (" << entry.string() << ") " << damaged
                      << "; building it again\n";
          }
        }
      }
      if (!r.ok) {
        // Build in a private folder, publish with one rename: a crash never leaves half an entry.
        const fs::path tmp = fs::path(opt.cache_dir) / (".tmp-" + r.key + "-" + std::to_string(getpid()));
        fs::create_directories(tmp);
        write_text_file(tmp / "kernel.cu", job.source);
        write_text_file(tmp / "fact_gemm_abi.h", abi_header_text());
        write_text_file(tmp / "fact_norm_abi.h", norm_abi_header_text());
        write_text_file(tmp / "fact_attention_abi.h", attention_abi_header_text());
        write_text_file(tmp / "fact_pointwise_abi.h", pointwise_abi_header_text());
        std::vector<std::string> argv = {opt.nvcc};
        argv.insert(argv.end(), flags.begin(), flags.end());
        std::vector<fs::path> includes = {fs::path(opt.cutlass_dir) / "include",
                                          fs::path(opt.cutlass_dir) / "tools" / "util" / "include", tmp};
        if (attention) includes.push_back(attention_example_dir(opt.cutlass_dir, job.source));
        for (const auto& inc : includes) argv.push_back("-I" + inc.string());
        argv.insert(argv.end(), {(tmp / "kernel.cu").string(), "-o", (tmp / "kernel.so").string()});
        const Ended ended = run_logged(argv, tmp / "build.log", opt.timeout_s);
        r.ok = ended.status == 0 && fs::exists(tmp / "kernel.so");
        nlohmann::json meta = {{"name", job.name},     {"key", r.key},          {"ok", r.ok},
                               {"rc", ended.status},   {"signal", ended.signal}, {"timed_out", ended.timed_out}};
        if (r.ok) {  // what check_cached_library compares before every reuse
          const std::string bytes = read_file(tmp / "kernel.so");
          meta["size"] = bytes.size();
          meta["sha256"] = sha256_hex(bytes);
        }
        write_text_file(tmp / "meta.json", meta.dump(2));
        if (r.ok) {
          std::error_code rename_error;
          fs::rename(tmp, entry, rename_error);
          if (rename_error) fs::remove_all(tmp);  // another process published the same key first
        } else {
          const fs::path failed = fs::path(opt.cache_dir) / ("failed-" + r.key);
          fs::remove_all(failed);
          fs::rename(tmp, failed);
          r.log = (failed / "build.log").string();
          r.library.clear();
          if (ended.timed_out) {
            r.error = "nvcc ran past the compile timeout of " + std::to_string(static_cast<int>(opt.timeout_s)) +
                      " s (--compile-timeout, FACT_COMPILE_TIMEOUT) and was stopped";
          } else if (ended.signal) {
            r.error = std::string("nvcc was killed by signal ") + std::to_string(ended.signal) + " (" +
                      strsignal(ended.signal) + "; out of memory? fewer --jobs may help)";
          } else if (ended.status < 0) {
            r.error = "nvcc could not be started";
          } else {
            r.error = first_error_lines(read_file(r.log));
          }
          r.error += "; its log: " + r.log;
        }
      }
      if (r.ok) r.advisories = ptxas_advisories(read_file(r.log));
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } catch (const std::exception& e) {
      r.ok = false;
      r.library.clear();
      r.error = std::string("could not compile: ") + e.what();
    }
  };
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const auto& job = jobs[i];
      auto& r = results[i];
      compile_one(job, r);
      const size_t n = ++done;
      if (!opt.quiet) {
        std::lock_guard<std::mutex> lock(print);
        std::cerr << "[" << n << "/" << jobs.size() << "] " << job.name << ": "
                  << (r.cached ? "cached" : r.ok ? "compiled" : "FAILED (" + r.log + ")");
        if (!r.cached) std::cerr << " in " << static_cast<int>(r.seconds) << " s";
        for (const auto& a : r.advisories) std::cerr << "\n    ptxas " << a;
        std::cerr << std::endl;
      }
    }
  };
  const int n_jobs = opt.jobs > 0 ? opt.jobs : default_compile_jobs(jobs.size(), std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(n_jobs, static_cast<int>(jobs.size())); ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  return results;
}

}  // namespace fact::realize
