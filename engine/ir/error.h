// Errors: whose fault it is.
//
// UserError: bad input (a file, a graph, an option). Its message names the offending thing and
// says what to do; the CLI prints it as "error: ..." and exits 2.
// InternalError: a bug in FACT. FACT_CHECK records file and line.
#pragma once

#include <stdexcept>
#include <string>

namespace fact {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace fact

#define FACT_CHECK(cond, msg)                                      \
  do {                                                             \
    if (!(cond)) ::fact::internal_error(__FILE__, __LINE__, (msg)); \
  } while (0)
