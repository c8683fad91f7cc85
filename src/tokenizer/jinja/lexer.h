// Jinja lexer with the whitespace rules of jinja2 as transformers configures it:
// trim_blocks and lstrip_blocks on, `-`/`+` whitespace control, newlines normalised to
// "\n" and one trailing newline dropped (keep_trailing_newline=False).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moeserve::jinja {

struct Token {
  enum class Type { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Type type;
  std::string text;  // Data text, name, decoded string literal, operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws moeserve::Error("line N: ...") on unterminated tags, strings or bad characters.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& opt = {});

}  // namespace moeserve::jinja
