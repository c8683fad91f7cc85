// Tokenizer: splits template text into data and tag tokens, then tokenizes expressions
// inside {{ }} and {% %}. Mirrors jinja2's lexer rules (see lexer.h).
#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja/value.h"

namespace moeserve::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python str.rstrip() (all Unicode whitespace).
std::string py_rstrip(const std::string& s) {
  std::u32string u = utf8_decode(s);
  size_t n = u.size();
  while (n > 0 && py_isspace(u[n - 1])) --n;
  if (n == u.size()) return s;
  return utf8_encode(u.substr(0, n));
}

// Newlines normalised to \n; one trailing newline removed.
std::string normalize(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] == '\r') {
      out += '\n';
      if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
    } else {
      out += src[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& src, const LexerOptions& opt) : s_(normalize(src)), opt_(opt) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t start = find_tag(pos_);
      std::string text = s_.substr(pos_, start - pos_);
      int text_line = line_;
      line_ += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      if (start == s_.size()) {
        emit_data(text, text_line);
        pos_ = start;
        break;
      }
      char kind = s_[start + 1];  // '{', '%' or '#'
      char sign = start + 2 < s_.size() ? s_[start + 2] : 0;
      if (sign != '-' && sign != '+') sign = 0;
      if (sign == '-') {
        text = py_rstrip(text);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            std::all_of(text.begin() + static_cast<long>(l_pos), text.end(), is_ws))
          text.resize(l_pos);
      }
      emit_data(text, text_line);
      pos_ = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        line_starting = lex_comment();
      } else if (kind == '%' && try_raw(sign)) {
        line_starting = false;
      } else {
        line_starting = lex_tag(kind == '%');
      }
    }
    out_.push_back({Token::Type::Eof, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < s_.size(); ++k)
      if (s_[k] == '{' && (s_[k + 1] == '{' || s_[k + 1] == '%' || s_[k + 1] == '#')) return k;
    return s_.size();
  }
  void emit_data(const std::string& text, int line) {
    if (!text.empty()) out_.push_back({Token::Type::Data, text, 0, 0, line});
  }
  void advance_to(size_t p) {
    line_ += static_cast<int>(std::count(s_.begin() + static_cast<long>(pos_), s_.begin() + static_cast<long>(p), '\n'));
    pos_ = p;
  }
  // After a closing delimiter: `-` eats all following whitespace, else trim_blocks eats one
  // newline (block and comment tags only). Returns whether the consumed text ended in \n.
  bool finish_end(size_t after, bool dash, bool trim) {
    size_t p = after;
    if (dash) {
      while (p < s_.size() && is_ws(s_[p])) ++p;
    } else if (trim && p < s_.size() && s_[p] == '\n') {
      ++p;
    }
    advance_to(p);
    return p > 0 && s_[p - 1] == '\n';
  }

  bool lex_comment() {
    if (pos_ >= s_.size()) return false;  // jinja2 quirk: "{#" ending the template is accepted
    size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) fail("line {}: missing end of comment tag", line_);
    bool dash = end > pos_ && s_[end - 1] == '-';
    advance_to(end);
    return finish_end(end + 2, dash, opt_.trim_blocks);
  }

  // {% raw %}...{% endraw %}: the body is data, untouched.
  bool try_raw(char sign) {
    size_t p = pos_;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    bool dash_end = false;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) dash_end = s_[p++] == '-';
    if (s_.compare(p, 2, "%}") != 0) return false;
    (void)sign;
    size_t body = p + 2;
    if (dash_end) while (body < s_.size() && is_ws(s_[body])) ++body;
    // Find {%[-+]? endraw [-+]?%}
    for (size_t k = s_.find("{%", body); k != std::string::npos; k = s_.find("{%", k + 2)) {
      size_t q = k + 2;
      char isign = q < s_.size() && (s_[q] == '-' || s_[q] == '+') ? s_[q++] : 0;
      while (q < s_.size() && is_ws(s_[q])) ++q;
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < s_.size() && is_ws(s_[q])) ++q;
      bool edash = false;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) edash = s_[q++] == '-';
      if (s_.compare(q, 2, "%}") != 0) continue;
      std::string text = s_.substr(body, k - body);
      if (isign == '-') text = py_rstrip(text);
      advance_to(body);
      emit_data(text, line_);
      advance_to(k);
      finish_end(q + 2, edash, opt_.trim_blocks);
      return true;
    }
    fail("line {}: missing end of raw directive", line_);
  }

  // Tokenizes the inside of {{ }} / {% %}; returns whether the end match ended in \n.
  bool lex_tag(bool block) {
    int begin_line = line_;
    out_.push_back({block ? Token::Type::BlockBegin : Token::Type::VarBegin, "", 0, 0, line_});
    int depth = 0;
    while (true) {
      while (pos_ < s_.size() && is_ws(s_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= s_.size())
        fail("line {}: unexpected end of template, expected end of {}", begin_line,
             block ? "block tag '%}'" : "print statement '}}'");
      const char* end = block ? "%}" : "}}";
      if (depth == 0) {
        bool dash = s_.compare(pos_, 3, std::string("-") + end) == 0;
        bool plus = block && s_.compare(pos_, 3, std::string("+") + end) == 0;
        if (dash || plus || s_.compare(pos_, 2, end) == 0) {
          out_.push_back({block ? Token::Type::BlockEnd : Token::Type::VarEnd, "", 0, 0, line_});
          size_t after = pos_ + (dash || plus ? 3 : 2);
          return finish_end(after, dash, block && !plus && opt_.trim_blocks);
        }
      }
      char c = s_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t p = pos_;
        while (p < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[p])) || s_[p] == '_')) ++p;
        out_.push_back({Token::Type::Name, s_.substr(pos_, p - pos_), 0, 0, line_});
        pos_ = p;
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                    "=",  ".",  ",",  ":",  "|",  "(",  ")", "[", "]", "{", "}", ";"};
        const char* hit = nullptr;
        for (const char* op : ops)
          if (s_.compare(pos_, std::strlen(op), op) == 0) { hit = op; break; }
        if (!hit) fail("line {}: unexpected char '{}'", line_, c);
        std::string op = hit;
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") depth = std::max(0, depth - 1);
        out_.push_back({Token::Type::Op, op, 0, 0, line_});
        pos_ += op.size();
      }
    }
  }

  void lex_number() {
    size_t p = pos_;
    auto digits = [&] {
      while (p < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[p])) || s_[p] == '_')) ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < s_.size() && s_[p] == '.' && std::isdigit(static_cast<unsigned char>(s_[p + 1]))) {
      ++p;
      digits();
      is_float = true;
    }
    if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
      size_t q = p + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string txt;
    for (size_t k = pos_; k < p; ++k)
      if (s_[k] != '_') txt += s_[k];
    Token t{is_float ? Token::Type::Float : Token::Type::Int, txt, 0, 0, line_};
    try {
      if (is_float) t.fval = std::stod(txt);
      else t.ival = std::stoll(txt);
    } catch (const std::exception&) {
      fail("line {}: number out of range: {}", line_, txt);
    }
    out_.push_back(t);
    pos_ = p;
  }

  // String literal with Python unicode-escape decoding.
  void lex_string(char q) {
    int start_line = line_;
    size_t p = pos_ + 1;
    std::string val;
    while (true) {
      if (p >= s_.size()) fail("line {}: unterminated string", start_line);
      char c = s_[p];
      if (c == q) break;
      if (c != '\\') {
        val += c;
        ++p;
        continue;
      }
      if (p + 1 >= s_.size()) fail("line {}: unterminated string", start_line);
      char e = s_[p + 1];
      p += 2;
      auto hex = [&](int n) {
        if (p + static_cast<size_t>(n) > s_.size() ||
            !std::all_of(s_.begin() + static_cast<long>(p), s_.begin() + static_cast<long>(p) + n, ::isxdigit))
          fail("line {}: truncated \\xXX / \\uXXXX escape in string", line_);
        unsigned long code = std::stoul(s_.substr(p, static_cast<size_t>(n)), nullptr, 16);
        if (code > 0x10ffff) fail("line {}: illegal Unicode character in string", line_);
        char32_t v = static_cast<char32_t>(code);
        p += static_cast<size_t>(n);
        utf8_append(val, v);
      };
      switch (e) {
        case 'n': val += '\n'; break;
        case 't': val += '\t'; break;
        case 'r': val += '\r'; break;
        case '\\': val += '\\'; break;
        case '\'': val += '\''; break;
        case '"': val += '"'; break;
        case 'a': val += '\a'; break;
        case 'b': val += '\b'; break;
        case 'f': val += '\f'; break;
        case 'v': val += '\v'; break;
        case '\n': break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0', n = 1;
            while (n < 3 && p < s_.size() && s_[p] >= '0' && s_[p] <= '7') v = v * 8 + (s_[p++] - '0'), ++n;
            utf8_append(val, static_cast<char32_t>(v));
          } else {
            val += '\\';
            val += e;
          }
      }
    }
    out_.push_back({Token::Type::String, val, 0, 0, start_line});
    advance_to(p + 1);
  }

  std::string s_;
  LexerOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& opt) {
  return Lexer(source, opt).run();
}

}  // namespace moeserve::jinja
