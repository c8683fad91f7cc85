// Jinja syntax tree: expressions and statements, each carrying its source line.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace moeserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // value
    Name,      // name
    List,      // items
    Tuple,     // items
    Dict,      // items as key,value pairs (even count)
    Attr,      // a.name            : args[0], name
    Item,      // a[b]              : args[0], args[1]
    Slice,     // a[b:c:d]          : args[0], args[1..3] (null where omitted)
    Call,      // f(args, kw)       : args[0] = callee, args[1..] positional, kwargs
    Filter,    // a | name(args)    : args[0] = value (null for {% filter %} blocks), name
    Test,      // a is [not] name   : args[0] = value, name, negated
    Unary,     // op a              : op in {"-", "+", "not"}
    Binary,    // a op b            : op in {+,-,*,/,//,%,**,~,and,or}
    Compare,   // a op1 b op2 c     : args, ops (==,!=,<,>,<=,>=,in,notin)
    CondExpr,  // a if b else c     : args[0]=a, args[1]=b, args[2]=c or null
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // Name/Attr/Filter/Test identifier; Unary/Binary operator
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Target {  // assignment target: name, ns.attr, or a tuple of names
  std::vector<std::string> names;
  std::string attr;  // non-empty: names[0].attr
  bool is_tuple = false;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind { Data, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Scope };
  Kind kind;
  int line = 0;
  std::string text;                                     // Data; Macro name
  ExprPtr expr;                                         // Output / Set value / For iter / CallBlock call
  ExprPtr cond;                                         // For `if` filter
  ExprPtr filter;                                       // SetBlock / FilterBlock filter chain (Filter exprs)
  Target target;                                        // Set / SetBlock / For
  std::vector<std::pair<ExprPtr, Body>> branches;       // If: (cond, body) for if/elif
  Body body;                                            // For / Macro / SetBlock / CallBlock / Scope
  Body else_body;                                       // If / For
  std::vector<MacroParam> params;                       // Macro / CallBlock (caller params)
  bool recursive = false;                               // For
};

struct Template {
  Body body;
};

// Parses tokens into a tree. Throws moeserve::Error("line N: ...") on syntax errors.
std::shared_ptr<Template> parse_template(const std::string& source);

}  // namespace moeserve::jinja
