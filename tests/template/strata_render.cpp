// Renders a chat template with Strata's renderer, for the comparison with Python's jinja2:
//   strata_render TEMPLATE CONTEXT.json YYYY-MM-DD
// The output goes to stdout as it is; an error goes to stderr, with exit status 3 when the
// template raised it (raise_exception) and 2 otherwise.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include "template/jinja.h"

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: strata_render TEMPLATE CONTEXT.json YYYY-MM-DD\n";
    return 1;
  }
  std::tm now{};
  if (std::sscanf(argv[3], "%d-%d-%d", &now.tm_year, &now.tm_mon, &now.tm_mday) != 3) {
    std::cerr << "bad date " << argv[3] << "\n";
    return 1;
  }
  now.tm_year -= 1900;
  now.tm_mon -= 1;
  // Fills in the weekday and day of the year, which %a or %j would print.
  std::time_t t = timegm(&now);
  gmtime_r(&t, &now);
  try {
    strata::jinja::Template tmpl(read_file(argv[1]));
    std::string out = tmpl.render(nlohmann::ordered_json::parse(read_file(argv[2])), now);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  } catch (const strata::jinja::RaisedError& e) {
    std::cerr << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
