// Tree-walking renderer: evaluates expressions with Python semantics and executes
// statements with jinja2's scoping (for-loop iterations and macros get their own scope;
// if/set do not; namespace() objects are the way to carry state out of loops).
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/format.h"
#include "tokenizer/jinja/jinja.h"

namespace moeserve::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  const Value* lookup(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(n);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

// This thread's stack size (the main thread's comes from RLIMIT_STACK); 8 MiB if unknown.
size_t thread_stack_bytes() {
  thread_local const size_t bytes = [] {
    size_t n = 0;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstacksize(&attr, &n);
      pthread_attr_destroy(&attr);
    }
    return n > 0 ? n : size_t{8} << 20;
  }();
  return bytes;
}

bool has_line_prefix(const char* msg) { return std::string_view(msg).substr(0, 5) == "line "; }

class Renderer {
 public:
  Renderer(Scope& root, const RenderLimits& limits)
      : root_(root),
        limits_(limits),
        stack_base_(static_cast<const char*>(__builtin_frame_address(0))),
        stack_budget_(std::min(limits.max_stack_bytes, thread_stack_bytes() / 2)) {}

  Flow exec(const Body& body, Scope& sc, std::string& out) {
    for (const auto& st : body) {
      Flow f = exec_one(*st, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  Flow exec_one(const Stmt& st, Scope& sc, std::string& out) {
    check_stack();
    try {
      return exec_stmt(st, sc, out);
    } catch (const Error& e) {
      if (has_line_prefix(e.what())) throw;
      throw Error(fmt::format("line {}: {}", st.line, e.what()));
    }
  }

  Flow exec_stmt(const Stmt& st, Scope& sc, std::string& out) {
    switch (st.kind) {
      case Stmt::Kind::Data: append(out, st.text); return Flow::Normal;
      case Stmt::Kind::Output: append(out, py_str(eval(*st.expr, sc))); return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : st.branches)
          if (eval(*cond, sc).truthy()) return exec(body, sc, out);
        return exec(st.else_body, sc, out);
      case Stmt::Kind::For: exec_for(st, sc, out); return Flow::Normal;
      case Stmt::Kind::Set: assign(st.target, eval(*st.expr, sc), sc, st.line); return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string buf;
        exec(st.body, sc, buf);
        Value v = Value::string(std::move(buf));
        if (st.filter) v = eval_filter(*st.filter, sc, &v);
        assign(st.target, v, sc, st.line);
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: {
        Value m = make_macro(st, "");
        sc.vars[st.text] = m;
        return Flow::Normal;
      }
      case Stmt::Kind::CallBlock: {
        Value caller = make_macro(st, "caller");
        append(out, py_str(eval_call(*st.expr, sc, &caller)));
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string buf;
        exec(st.body, sc, buf);
        Value v = Value::string(std::move(buf));
        append(out, py_str(eval_filter(*st.filter, sc, &v)));
        return Flow::Normal;
      }
      case Stmt::Kind::Scope: return exec(st.body, sc, out);
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  void assign(const Target& t, const Value& v, Scope& sc, int line) {
    if (!t.attr.empty()) {
      const Value* ns = sc.lookup(t.names[0]);
      if (!ns || ns->kind != Value::Kind::Namespace)
        fail("line {}: cannot assign attribute on non-namespace object", line);
      // Namespaces are the one mutable value: storing one inside another could build cycles
      // and chains whose depth no constructor saw (kMaxValueDepth), so it is refused.
      if (v.kind == Value::Kind::Namespace || v.holds_namespace)
        fail("line {}: storing a namespace object in a namespace attribute is not supported", line);
      for (auto& [k, e] : *ns->dict)
        if (k == t.attr) {
          e = v;
          return;
        }
      ns->dict->emplace_back(t.attr, v);
      return;
    }
    if (!t.is_tuple) {
      sc.vars[t.names[0]] = v;
      return;
    }
    List items = iterate(v);
    if (items.size() != t.names.size())
      fail("line {}: cannot unpack {} values into {} names", line, items.size(), t.names.size());
    for (size_t k = 0; k < items.size(); ++k) sc.vars[t.names[k]] = items[k];
  }

  void exec_for(const Stmt& st, Scope& sc, std::string& out) {
    Value seq = eval(*st.expr, sc);
    if (seq.kind == Value::Kind::None || seq.is_number() || seq.kind == Value::Kind::Namespace ||
        seq.is_callable())
      fail("'{}' object is not iterable", seq.type_name());
    List all = iterate(seq);
    if (st.cond) {  // `for x in xs if cond`: filter first, so loop.length/last see the filtered list
      List kept;
      for (const Value& item : all) {
        count_iteration();
        Scope fs;
        fs.parent = &sc;
        assign(st.target, item, fs, st.line);
        if (eval(*st.cond, fs).truthy()) kept.push_back(item);
      }
      all = std::move(kept);
    }
    const Value* outer_loop = sc.lookup("loop");
    int64_t depth = 1;
    if (outer_loop && outer_loop->kind == Value::Kind::Namespace && st.recursive)
      if (const Value* d = outer_loop->find("depth")) depth = d->i + 1;
    int64_t n = static_cast<int64_t>(all.size());
    auto last_changed = std::make_shared<std::optional<Value>>();  // loop.changed() state, shared by iterations
    for (int64_t k = 0; k < n; ++k) {
      count_iteration();
      Scope it;
      it.parent = &sc;
      assign(st.target, all[static_cast<size_t>(k)], it, st.line);
      Dict loop = {
          {"index", Value::integer(k + 1)},
          {"index0", Value::integer(k)},
          {"revindex", Value::integer(n - k)},
          {"revindex0", Value::integer(n - k - 1)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == n - 1)},
          {"length", Value::integer(n)},
          {"depth", Value::integer(depth)},
          {"depth0", Value::integer(depth - 1)},
          {"previtem", k > 0 ? all[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item")},
          {"nextitem", k + 1 < n ? all[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item")},
      };
      loop.emplace_back("cycle", Value::function([k](CallArgs& a) -> Value {
                          if (a.pos->empty()) fail("no items for cycling given");
                          return (*a.pos)[static_cast<size_t>(k) % a.pos->size()];
                        }));
      loop.emplace_back("changed", Value::function([last_changed](CallArgs& a) -> Value {
                          Value now = Value::make_list(*a.pos, true);
                          if (*last_changed && py_equal(**last_changed, now)) return Value::boolean(false);
                          *last_changed = now;
                          return Value::boolean(true);
                        }));
      Value lv = Value::make_namespace(std::move(loop));
      it.vars["loop"] = lv;
      Flow f = exec(st.body, it, out);
      if (f == Flow::Break) break;
    }
    if (n == 0) exec(st.else_body, sc, out);
  }

  Value make_macro(const Stmt& st, const std::string& name) {
    const Stmt* def = &st;
    Renderer* self = this;
    std::string mname = name.empty() ? st.text : name;
    return Value::function([def, self, mname](CallArgs& a) -> Value {
      if (++self->depth_ > self->limits_.max_recursion_depth)
        fail("maximum recursion depth ({}) exceeded in macro '{}'", self->limits_.max_recursion_depth, mname);
      struct Guard {
        int& d;
        ~Guard() { --d; }
      } guard{self->depth_};
      Scope ms;
      ms.parent = &self->root_;
      if (a.pos->size() > def->params.size())
        fail("macro '{}' takes not more than {} argument(s)", mname, def->params.size());
      std::vector<bool> bound(def->params.size(), false);
      for (size_t k = 0; k < a.pos->size(); ++k) {
        ms.vars[def->params[k].name] = (*a.pos)[k];
        bound[k] = true;
      }
      for (auto& [kname, kv] : *a.kw) {
        bool found = false;
        for (size_t k = 0; k < def->params.size(); ++k)
          if (def->params[k].name == kname) {
            if (bound[k]) fail("macro '{}' got multiple values for argument '{}'", mname, kname);
            ms.vars[kname] = kv;
            bound[k] = found = true;
          }
        if (!found && kname == "caller") {
          ms.vars["caller"] = kv;
          found = true;
        }
        if (!found) fail("macro '{}' takes no keyword argument '{}'", mname, kname);
      }
      for (size_t k = 0; k < def->params.size(); ++k) {
        if (bound[k]) continue;
        const auto& p = def->params[k];
        ms.vars[p.name] = p.default_value ? self->eval(*p.default_value, ms)
                                          : Value::undefined(fmt::format("parameter '{}' was not provided", p.name));
      }
      std::string buf;
      self->exec(def->body, ms, buf);
      return Value::string(std::move(buf));
    });
  }

 public:
  Value eval(const Expr& e, Scope& sc) {
    check_stack();
    try {
      Value v = eval_inner(e, sc);
      check_size(v);
      return v;
    } catch (const Error& err) {
      if (has_line_prefix(err.what())) throw;
      throw Error(fmt::format("line {}: {}", e.line, err.what()));
    }
  }

 private:
  Value eval_inner(const Expr& e, Scope& sc) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::Literal: return e.value;
      case K::Name: {
        if (const Value* v = sc.lookup(e.name)) return *v;
        Value g = make_global(e.name);
        if (!g.is_undefined()) return g;
        return Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case K::List:
      case K::Tuple: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a, sc));
        return Value::make_list(std::move(l), e.kind == K::Tuple);
      }
      case K::Dict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], sc);
          std::string ks = dict_key(key);
          Value val = eval(*e.args[k + 1], sc);
          bool replaced = false;
          for (auto& [dk, dv] : d)
            if (dk == ks) dv = val, replaced = true;
          if (!replaced) d.emplace_back(std::move(ks), std::move(val));
        }
        return Value::make_dict(std::move(d));
      }
      case K::Attr: return get_attr(eval(*e.args[0], sc), e.name);
      case K::Item: return get_item(eval(*e.args[0], sc), eval(*e.args[1], sc));
      case K::Slice: {
        Value base = eval(*e.args[0], sc);
        Value parts[3];
        for (int k = 0; k < 3; ++k) parts[k] = e.args[1 + k] ? eval(*e.args[1 + k], sc) : Value::none();
        return get_slice(base, parts[0], parts[1], parts[2]);
      }
      case K::Call: return eval_call(e, sc, nullptr);
      case K::Filter: return eval_filter(e, sc, nullptr);
      case K::Test: {
        Value v = eval(*e.args[0], sc);
        std::vector<Value> pos;
        std::vector<std::pair<std::string, Value>> kw;
        for (size_t k = 1; k < e.args.size(); ++k) pos.push_back(eval(*e.args[k], sc));
        for (const auto& [n, x] : e.kwargs) kw.emplace_back(n, eval(*x, sc));
        CallArgs ca{&pos, &kw, e.line};
        bool r = apply_test(e.name, v, ca);
        return Value::boolean(e.negated ? !r : r);
      }
      case K::Unary: {
        Value v = eval(*e.args[0], sc);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.name, v.type_name());
        if (e.name == "+") return v.kind == Value::Kind::Bool ? Value::integer(v.b) : v;
        if (v.kind == Value::Kind::Float) return Value::floating(-v.f);
        if (v.kind == Value::Kind::Int && v.i == INT64_MIN) checked(true, &v.i);
        return Value::integer(-(v.kind == Value::Kind::Bool ? int64_t(v.b) : v.i));
      }
      case K::Binary: {
        if (e.name == "and") {
          Value l = eval(*e.args[0], sc);
          return l.truthy() ? eval(*e.args[1], sc) : l;
        }
        if (e.name == "or") {
          Value l = eval(*e.args[0], sc);
          return l.truthy() ? l : eval(*e.args[1], sc);
        }
        Value l = eval(*e.args[0], sc), r = eval(*e.args[1], sc);
        return binary_op(e.name, l, r);
      }
      case K::Compare: {
        Value l = eval(*e.args[0], sc);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.args[k + 1], sc);
          if (!compare(e.ops[k], l, r)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case K::CondExpr: {
        if (eval(*e.args[1], sc).truthy()) return eval(*e.args[0], sc);
        if (e.args[2]) return eval(*e.args[2], sc);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
    return Value::undefined();
  }

  Value eval_call(const Expr& e, Scope& sc, const Value* caller) {
    Value f = eval(*e.args[0], sc);
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    for (size_t k = 1; k < e.args.size(); ++k) pos.push_back(eval(*e.args[k], sc));
    for (const auto& [n, x] : e.kwargs) kw.emplace_back(n, eval(*x, sc));
    if (caller) kw.emplace_back("caller", *caller);
    if (f.is_undefined()) undefined_error(f);
    if (!f.is_callable()) fail("'{}' object is not callable", f.type_name());
    CallArgs ca{&pos, &kw, e.line};
    return (*f.fn)(ca);
  }

  Value eval_filter(const Expr& e, Scope& sc, const Value* injected) {
    Value base;
    if (!e.args[0]) base = *injected;
    else if (e.args[0]->kind == Expr::Kind::Filter && injected) base = eval_filter(*e.args[0], sc, injected);
    else base = eval(*e.args[0], sc);
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    for (size_t k = 1; k < e.args.size(); ++k) pos.push_back(eval(*e.args[k], sc));
    for (const auto& [n, x] : e.kwargs) kw.emplace_back(n, eval(*x, sc));
    CallArgs ca{&pos, &kw, e.line};
    try {
      return apply_filter(e.name, base, ca);
    } catch (const Error& err) {
      if (has_line_prefix(err.what())) throw;
      throw Error(fmt::format("line {}: {}", e.line, err.what()));
    }
  }

  static bool compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return py_equal(l, r);
    if (op == "!=") return !py_equal(l, r);
    if (op == "in" || op == "notin") {
      bool found = contains(r, l);
      return op == "in" ? found : !found;
    }
    if (l.is_undefined()) undefined_error(l);
    if (r.is_undefined()) undefined_error(r);
    if (op == "<") return py_less(l, r);
    if (op == ">") return py_less(r, l);
    if (op == "<=") return !py_less(r, l);
    if (op == ">=") return !py_less(l, r);
    fail("unknown comparison {}", op);
  }

 public:
  static bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Value::Kind::Undefined: return false;
      case Value::Kind::String:
        if (!item.is_string())
          fail("'in <string>' requires string as left operand, not {}", item.type_name());
        return container.s.find(item.s) != std::string::npos;
      case Value::Kind::List:
        for (const Value& x : *container.list)
          if (py_equal(x, item)) return true;
        return false;
      case Value::Kind::Dict: return find_key(container, item) != nullptr;
      default: fail("argument of type '{}' is not iterable", container.type_name());
    }
  }

 private:
  // Reads *v only after the overflow builtin (an argument) has written it.
  static int64_t checked(bool overflow, const int64_t* v) {
    if (overflow) fail("integer overflow (values beyond 64 bits are not supported)");
    return *v;
  }

  static Value binary_op(const std::string& op, const Value& l, const Value& r) {
    using K = Value::Kind;
    if (op == "~") return Value::string(py_str(l) + py_str(r));
    if (l.is_undefined()) undefined_error(l);
    if (r.is_undefined()) undefined_error(r);
    auto type_err = [&]() -> Value {
      fail("unsupported operand type(s) for {}: '{}' and '{}'", op, l.type_name(), r.type_name());
    };
    if (l.is_number() && r.is_number()) {
      bool ints = l.kind != K::Float && r.kind != K::Float;
      int64_t a = l.kind == K::Bool ? l.b : l.i, b = r.kind == K::Bool ? r.b : r.i;
      double x = l.as_double(), y = r.as_double();
      int64_t res = 0;
      if (op == "+") return ints ? Value::integer(checked(__builtin_add_overflow(a, b, &res), &res)) : Value::floating(x + y);
      if (op == "-") return ints ? Value::integer(checked(__builtin_sub_overflow(a, b, &res), &res)) : Value::floating(x - y);
      if (op == "*") return ints ? Value::integer(checked(__builtin_mul_overflow(a, b, &res), &res)) : Value::floating(x * y);
      if (op == "/") {
        if (y == 0) fail("division by zero");
        return Value::floating(x / y);
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail("integer division or modulo by zero");
        if (ints) {
          // a / -1 traps for INT64_MIN (the quotient 2^63 does not fit): Python gives
          // -a and 0, so only INT64_MIN // -1 overflows.
          if (b == -1) return op == "%" ? Value::integer(0) : Value::integer(checked(a == INT64_MIN, &a) * -1);
          int64_t q = a / b, m = a % b;
          if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;
          return Value::integer(op == "//" ? q : m);
        }
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return op == "//" ? Value::floating(std::floor(x / y)) : Value::floating(m);
      }
      if (op == "**") {
        if (ints && b >= 0) {
          int64_t acc = 1, base = a;
          for (int64_t k = b; k > 0; k >>= 1) {
            if (k & 1) checked(__builtin_mul_overflow(acc, base, &acc), &acc);
            if (k > 1) checked(__builtin_mul_overflow(base, base, &base), &base);
          }
          return Value::integer(acc);
        }
        return Value::floating(std::pow(x, y));
      }
      return type_err();
    }
    if (op == "%" && l.is_string()) return Value::string(py_percent_format(l.s, r));
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        if (!l.markup && !r.markup) return Value::string(l.s + r.s);
        // Markup + str escapes the str (markupsafe), even without autoescape.
        return make_markup((l.markup ? l.s : html_escape(l.s)) + (r.markup ? r.s : html_escape(r.s)));
      }
      if (l.is_list() && r.is_list() && l.is_tuple == r.is_tuple) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::make_list(std::move(out), l.is_tuple);
      }
      return type_err();
    }
    if (op == "*") {
      const Value& seq = l.is_number() ? r : l;
      const Value& cnt = l.is_number() ? l : r;
      if (!cnt.is_number() || cnt.kind == K::Float) return type_err();
      int64_t c = cnt.kind == K::Bool ? cnt.b : cnt.i;
      size_t unit = seq.is_string() ? seq.s.size() : seq.is_list() ? seq.list->size() : 0;
      if (c > 0 && unit > 0 && static_cast<uint64_t>(c) > (size_t{1} << 28) / unit) fail("repeated sequence too large");
      if (seq.is_string()) {
        std::string out;
        for (int64_t k = 0; k < c; ++k) out += seq.s;
        return Value::string(out);
      }
      if (seq.is_list()) {
        List out;
        for (int64_t k = 0; k < c; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
        return Value::make_list(std::move(out), seq.is_tuple);
      }
    }
    return type_err();
  }

  void append(std::string& out, const std::string& text) {
    if (out.size() + text.size() > limits_.max_output_bytes)
      fail("template output exceeds {} bytes (the output limit)", limits_.max_output_bytes);
    out += text;
  }
  // Recursion (macros, nested expressions and blocks) is bounded by the stack this render has
  // used, whatever combination produced it: frame sizes differ between builds (sanitizers).
  void check_stack() const {
    const char* here = static_cast<const char*>(__builtin_frame_address(0));
    if (stack_base_ > here && static_cast<size_t>(stack_base_ - here) > stack_budget_)
      fail("template recursion too deep (more than {} KiB of stack)", stack_budget_ >> 10);
  }
  void count_iteration() {
    if (++iterations_ > limits_.max_loop_iterations)
      fail("template loops ran more than {} iterations (the loop limit)", limits_.max_loop_iterations);
  }
  // Strings and lists built by expressions (~, +, *, filters, methods) stay within the
  // output limit, so doubling in a loop fails cleanly instead of exhausting memory.
  void check_size(const Value& v) const {
    if (v.kind == Value::Kind::String && v.s.size() > limits_.max_output_bytes)
      fail("string of {} bytes exceeds the template output limit ({} bytes)", v.s.size(), limits_.max_output_bytes);
    if (v.kind == Value::Kind::List && v.list->size() > limits_.max_output_bytes / 16)  // >= 16 bytes an item
      fail("list of {} items exceeds the template size limit", v.list->size());
  }

  Scope& root_;
  const RenderLimits& limits_;
  const char* stack_base_;
  size_t stack_budget_;
  int depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

CompiledTemplate CompiledTemplate::compile(const std::string& source) {
  CompiledTemplate t;
  t.tpl_ = parse_template(source);
  return t;
}

std::string CompiledTemplate::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  MS_CHECK(tpl_, "render() called on a template that was never compiled");
  Scope root;
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it) root.vars[it.key()] = Value::from_json(it.value());
  Renderer r(root, limits);
  std::string out;
  r.exec(tpl_->body, root, out);
  return out;
}

}  // namespace moeserve::jinja
