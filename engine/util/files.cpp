#include "util/files.h"

#include <fstream>

#include "ir/error.h"

namespace fact {

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw UserError(path.string() + ": cannot write (does the directory exist?)");
    f << text;
    f.close();
    if (!f) throw UserError(path.string() + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw UserError(path.string() + ": cannot write: " + ec.message());
}

}  // namespace fact
