// metro tokenize -m MODEL [--json] [--no-special] [--file F] [TEXT]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace metro::cli {
namespace {

// A piece for a terminal: valid UTF-8 as is except control characters, which are escaped
// like the bytes of an incomplete or invalid sequence (\xNN).
std::string printable_piece(std::string_view piece) {
  std::string out = "'";
  size_t i = 0;
  while (i < piece.size()) {
    const auto c = static_cast<unsigned char>(piece[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\' || c == '\'') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      const tokenizer::Utf8Scan r = tokenizer::utf8_scan(piece.substr(i));
      if (r.kind == tokenizer::Utf8Scan::kValid && r.cp >= 0xA0) {
        out.append(piece.substr(i, r.len));
        i += r.len;
        continue;
      }
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
    ++i;
  }
  return out + "'";
}

bool read_input(const std::string& path, std::string& out) {
  if (path == "-") {
    out.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    return true;
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return static_cast<bool>(f) || f.eof();
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Print the token ids and pieces of a text under a model's tokenizer",
               "metro tokenize"};
  std::string model_path, file_path, text;
  bool as_json = false, no_special = false;
  app.add_option("-m,--model", model_path, "GGUF file")->required();
  app.add_option("text", text, "text to tokenize");
  app.add_option("--file", file_path, "read the text from a file ('-' for stdin)");
  app.add_flag("--json", as_json, R"(one JSON object {"ids": [...], "pieces": [...]})");
  app.add_flag("--no-special", no_special,
               "add no BOS/EOS and treat special-token text as plain text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const bool have_text = app.count("text") > 0;
  if (have_text == !file_path.empty()) {
    std::fprintf(stderr, "metro tokenize: give either TEXT or --file\n");
    return 2;
  }
  if (!file_path.empty() && !read_input(file_path, text)) {
    std::fprintf(stderr, "metro tokenize: cannot read --file\n");
    return 1;
  }
  auto file = gguf::File::open(model_path);
  if (!file.ok()) return fail("tokenize", with_path(model_path, file.status()));
  auto tok = tokenizer::Tokenizer::from_gguf(*file);
  if (!tok.ok()) {
    std::fprintf(stderr, "metro tokenize: %s\n", tok.status().message().c_str());
    return 1;
  }
  const std::vector<int32_t> ids = tok->encode(text, !no_special, !no_special);
  if (as_json) {
    nlohmann::json pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(tok->token_to_piece(id));
    nlohmann::json j{{"ids", ids}, {"pieces", pieces}};
    // A piece may hold part of a character; the JSON writer shows such bytes as U+FFFD.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    for (int32_t id : ids) {
      std::printf("%8d  %s\n", id, printable_piece(tok->token_to_piece(id)).c_str());
    }
  }
  return 0;
}

}  // namespace metro::cli
