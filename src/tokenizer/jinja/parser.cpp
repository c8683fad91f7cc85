// Recursive-descent parser following jinja2's grammar and operator precedence:
// condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < postfix/filters.
#include <algorithm>
#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace moeserve::jinja {
namespace {

using TT = Token::Type;

// Statement blocks, expression levels (parentheses, `not`, unary signs, `else` branches)
// and chain links together; bounds both this recursive-descent parser's stack and the depth
// of the tree the renderer walks.
constexpr int kMaxTemplateNesting = 400;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  std::shared_ptr<Template> run() {
    auto tpl = std::make_shared<Template>();
    std::string end = subparse(tpl->body, {});
    (void)end;
    return tpl;
  }

 private:
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
  [[noreturn]] void error(const std::string& msg) const { fail("line {}: {}", cur().line, msg); }
  bool is_op(const char* op) const { return cur().type == TT::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TT::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++p_;
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case TT::Eof: return "end of template";
      case TT::BlockEnd: return "end of statement block";
      case TT::VarEnd: return "end of print statement";
      case TT::Data: return "template data";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(fmt::format("expected token '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != TT::Name) error(fmt::format("expected name, got {}", describe(cur())));
    return t_[p_++].text;
  }
  void expect_block_end() {
    if (cur().type != TT::BlockEnd) error(fmt::format("expected end of statement block, got {}", describe(cur())));
    ++p_;
  }

  // Parses statements until a block whose first name is in `ends` (returned, consumed up
  // to and including that name) or end of template (returns "").
  std::string subparse(Body& body, std::initializer_list<const char*> ends) {
    while (true) {
      const Token& tk = cur();
      if (tk.type == TT::Eof) {
        if (ends.size()) {
          std::string want;
          for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
          error("unexpected end of template, expected " + want);
        }
        return "";
      }
      if (tk.type == TT::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Data;
        s->line = tk.line;
        s->text = tk.text;
        body.push_back(std::move(s));
        ++p_;
      } else if (tk.type == TT::VarBegin) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = cur().line;
        s->expr = parse_tuple(true, false);
        if (cur().type != TT::VarEnd) error(fmt::format("expected end of print statement, got {}", describe(cur())));
        ++p_;
        body.push_back(std::move(s));
      } else if (tk.type == TT::BlockBegin) {
        ++p_;
        if (cur().type != TT::Name) error("tag name expected");
        for (const char* e : ends)
          if (cur().text == e) {
            ++p_;
            return e;
          }
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe(tk));
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    DepthGuard g(*this);
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    std::string tag = cur().text;
    ++p_;
    if (tag == "if") {
      s->kind = Stmt::Kind::If;
      ExprPtr cond = parse_tuple(false, false);
      expect_block_end();
      while (true) {
        Body b;
        std::string end = subparse(b, {"elif", "else", "endif"});
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_tuple(false, false);
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          subparse(s->else_body, {"endif"});
        }
        break;
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::For;
      s->target = parse_target(false);
      if (!skip_name("in")) error(fmt::format("expected 'in', got {}", describe(cur())));
      s->expr = parse_tuple(false, false, true);
      if (skip_name("if")) s->cond = parse_expression(true);
      s->recursive = skip_name("recursive");
      expect_block_end();
      ++loop_depth_;
      std::string end = subparse(s->body, {"endfor", "else"});
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        subparse(s->else_body, {"endfor"});
      }
    } else if (tag == "set") {
      s->target = parse_target(true);
      if (skip_op("=")) {
        s->kind = Stmt::Kind::Set;
        s->expr = parse_tuple(true, false);
      } else {
        s->kind = Stmt::Kind::SetBlock;
        if (is_op("|")) s->filter = parse_filter_chain(nullptr);
        expect_block_end();
        subparse(s->body, {"endset"});
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      parse_signature(s->params);
      expect_block_end();
      int saved = loop_depth_;
      loop_depth_ = 0;
      subparse(s->body, {"endmacro"});
      loop_depth_ = saved;
    } else if (tag == "call") {
      s->kind = Stmt::Kind::CallBlock;
      if (is_op("(")) parse_signature(s->params);
      s->expr = parse_expression(true);
      if (s->expr->kind != Expr::Kind::Call) error("expected call");
      expect_block_end();
      subparse(s->body, {"endcall"});
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      s->filter = parse_filter_chain(nullptr, true);
      expect_block_end();
      subparse(s->body, {"endfilter"});
    } else if (tag == "generation") {  // transformers' AssistantTracker: renders its body
      s->kind = Stmt::Kind::Scope;
      expect_block_end();
      subparse(s->body, {"endgeneration"});
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      if (loop_depth_ == 0) fail("line {}: '{}' outside of a loop", s->line, tag);
    } else {
      fail("line {}: encountered unknown tag '{}'", s->line, tag);
    }
    expect_block_end();
    return s;
  }

  void parse_signature(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam mp;
      mp.name = expect_name();
      if (skip_op("=")) mp.default_value = parse_expression(true);
      else if (!params.empty() && params.back().default_value) error("non-default argument follows default argument");
      params.push_back(std::move(mp));
    }
    expect_op(")");
  }

  Target parse_target(bool with_namespace) {
    Target t;
    if (with_namespace && cur().type == TT::Name && peek().type == TT::Op && peek().text == "." &&
        peek(2).type == TT::Name) {
      t.names.push_back(cur().text);
      t.attr = peek(2).text;
      p_ += 3;
      return t;
    }
    bool paren = skip_op("(");
    t.names.push_back(expect_name());
    while (skip_op(",")) {
      t.is_tuple = true;
      if (cur().type != TT::Name) break;
      t.names.push_back(expect_name());
    }
    if (paren) {
      t.is_tuple = true;
      expect_op(")");
    }
    return t;
  }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Comma-separated expressions; a single one without a trailing comma is itself.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, bool stop_at_recursive = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
      }
      if (cur().type == TT::VarEnd || cur().type == TT::BlockEnd || is_op(")") ||
          (stop_at_recursive && is_name("recursive")) || (!items.empty() && is_name("if") && !with_condexpr))
        break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!is_tuple) {
      if (items.empty()) {
        if (!explicit_parens) error(fmt::format("expected an expression, got {}", describe(cur())));
        auto e = make(Expr::Kind::Tuple, line);
        return e;
      }
      return std::move(items[0]);
    }
    auto e = make(Expr::Kind::Tuple, line);
    e->args = std::move(items);
    return e;
  }

  // Nesting guard: deeply nested input must fail cleanly, not overflow the stack.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxTemplateNesting) p.error(fmt::format("template nesting too deep (limit {} levels)", kMaxTemplateNesting));
    }
    ~DepthGuard() { --p.nesting_; }
  };
  // Left-associative chains (a + b + c, a.b.c, x | f | g, a if b else c if ...) build trees
  // as deep as they are long without recursing here; each link counts as one level of
  // nesting until the chain's function returns, so the tree the renderer walks (and the
  // destructor frees) recursively stays within the same limit.
  struct ChainGuard {
    Parser& p;
    int links = 0;
    explicit ChainGuard(Parser& parser) : p(parser) {}
    void link() {
      ++links;
      if (++p.nesting_ > kMaxTemplateNesting) p.error(fmt::format("template nesting too deep (limit {} levels)", kMaxTemplateNesting));
    }
    ~ChainGuard() { p.nesting_ -= links; }
  };

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    DepthGuard g(*this);  // `else` recurses
    ChainGuard chain(*this);
    ExprPtr e1 = parse_or();
    while (is_name("if")) {
      chain.link();
      int line = cur().line;
      ++p_;
      ExprPtr e2 = parse_or();
      ExprPtr e3 = skip_name("else") ? parse_condexpr() : nullptr;
      auto c = make(Expr::Kind::CondExpr, line);
      c->args.push_back(std::move(e1));
      c->args.push_back(std::move(e2));
      c->args.push_back(std::move(e3));
      e1 = std::move(c);
    }
    return e1;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::Binary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ChainGuard chain(*this);
    ExprPtr l = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      ++p_;
      chain.link();
      l = binary("or", std::move(l), parse_and(), line);
    }
    return l;
  }
  ExprPtr parse_and() {
    ChainGuard chain(*this);
    ExprPtr l = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      ++p_;
      chain.link();
      l = binary("and", std::move(l), parse_not(), line);
    }
    return l;
  }
  ExprPtr parse_not() {
    DepthGuard g(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::Unary, cur().line);
      ++p_;
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      std::string op;
      if (cur().type == TT::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && peek().type == TT::Name && peek().text == "in") {
        op = "notin";
        p_ += 2;
      } else {
        break;
      }
      ops.push_back(op);
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::Compare, line);
    e->args.push_back(std::move(first));
    for (auto& r : rest) e->args.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }
  ExprPtr parse_math1() {
    ChainGuard chain(*this);
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      ++p_;
      chain.link();
      l = binary(op, std::move(l), parse_concat(), line);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ChainGuard chain(*this);
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      ++p_;
      chain.link();
      l = binary("~", std::move(l), parse_math2(), line);
    }
    return l;
  }
  ExprPtr parse_math2() {
    ChainGuard chain(*this);
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      ++p_;
      chain.link();
      l = binary(op, std::move(l), parse_pow(), line);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ChainGuard chain(*this);
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      ++p_;
      chain.link();
      l = binary("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(Expr::Kind::Unary, cur().line);
      node->name = cur().text;
      ++p_;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == TT::Name) {
      ++p_;
      if (tk.text == "true" || tk.text == "True") return literal(Value::boolean(true), line);
      if (tk.text == "false" || tk.text == "False") return literal(Value::boolean(false), line);
      if (tk.text == "none" || tk.text == "None") return literal(Value::none(), line);
      auto e = make(Expr::Kind::Name, line);
      e->name = tk.text;
      return e;
    }
    if (tk.type == TT::String) {
      std::string s;
      while (cur().type == TT::String) s += t_[p_++].text;
      return literal(Value::string(s), line);
    }
    if (tk.type == TT::Int) {
      ++p_;
      return literal(Value::integer(tk.ival), line);
    }
    if (tk.type == TT::Float) {
      ++p_;
      return literal(Value::floating(tk.fval), line);
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(Expr::Kind::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      auto e = make(Expr::Kind::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    error(fmt::format("unexpected {}", describe(tk)));
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(Expr::Kind::Literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    ChainGuard chain(*this);
    while (true) {
      chain.link();
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == TT::Name) {
          auto e = make(Expr::Kind::Attr, line);
          e->name = t_[p_++].text;
          e->args.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().type == TT::Int) {
          auto e = make(Expr::Kind::Item, line);
          e->args.push_back(std::move(node));
          e->args.push_back(literal(Value::integer(t_[p_++].ival), line));
          node = std::move(e);
        } else {
          error("expected name or number after '.'");
        }
      } else if (skip_op("[")) {
        node = parse_subscript(std::move(node), line);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr base, int line) {
    ExprPtr parts[3];
    bool slice = false;
    int idx = 0;
    while (!is_op("]")) {
      if (skip_op(":")) {
        slice = true;
        if (++idx > 2) error("invalid slice");
        continue;
      }
      if (parts[idx]) error(fmt::format("expected ']', got {}", describe(cur())));
      parts[idx] = parse_expression(true);
      if (!slice && is_op(",")) error("tuple subscripts are not supported");
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) error("expected subscript expression");
      auto e = make(Expr::Kind::Item, line);
      e->args.push_back(std::move(base));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::Slice, line);
    e->args.push_back(std::move(base));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // Fills args (from index `skip` on) and kwargs of a call-like node.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("*args / **kwargs in calls are not supported");
      if (cur().type == TT::Name && peek().type == TT::Op && peek().text == "=") {
        std::string k = cur().text;
        p_ += 2;
        e.kwargs.emplace_back(k, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    ChainGuard chain(*this);
    while (true) {
      chain.link();
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // `| name(args) | name2 ...`; with start_without_pipe the first filter has no '|'.
  ExprPtr parse_filter_chain(ExprPtr node, bool start_without_pipe = false) {
    ChainGuard chain(*this);
    while (start_without_pipe || is_op("|")) {
      chain.link();
      if (!start_without_pipe) ++p_;
      start_without_pipe = false;
      auto e = make(Expr::Kind::Filter, cur().line);
      e->name = expect_name();
      while (skip_op(".")) e->name += "." + expect_name();
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    auto e = make(Expr::Kind::Test, cur().line);
    ++p_;  // 'is'
    e->negated = skip_name("not");
    e->name = expect_name();
    while (skip_op(".")) e->name += "." + expect_name();
    e->args.push_back(std::move(node));
    const Token& tk = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((tk.type == TT::Name || tk.type == TT::String || tk.type == TT::Int || tk.type == TT::Float ||
                is_op("(") || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) error("You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;  // for-loop bodies enclosing the current position (break/continue)
};

}  // namespace

std::shared_ptr<Template> parse_template(const std::string& source) {
  return Parser(tokenize(source)).run();
}

}  // namespace moeserve::jinja
