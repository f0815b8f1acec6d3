// Writing files the engine produces (run directories, cache entries, registry exports).
#pragma once

#include <filesystem>
#include <string>

namespace fact {

// Write `text` beside `path`, then rename it into place: a failure never leaves half a file.
// UserError naming the path when it cannot be written.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace fact
