// The typed debug registry (core/debug_flags.h): defaults, parsing, validation errors, the
// diagnostic-only refusal and the --help-debug text, on lookups the tests supply (no process
// environment involved).
#include "core/debug_flags.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"

namespace moeserve {
namespace {

EnvLookup env_of(const std::map<std::string, std::string>& m) {
  return [m](const char* name) -> const char* {
    auto it = m.find(name);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::map<std::string, std::string>& m, bool diag = false) {
  try {
    parse_debug_flags(env_of(m), diag);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DebugFlags, DefaultsAreTheShippedBehaviour) {
  const DebugFlags f = parse_debug_flags(env_of({}), false);
  EXPECT_TRUE(f.pdl);
  EXPECT_TRUE(f.prefill_off.empty());
  EXPECT_TRUE(f.decode_off.empty());
  EXPECT_FALSE(f.decode_mega);
  EXPECT_FALSE(f.mega_timing);
  EXPECT_TRUE(f.op_repeat.empty());
  EXPECT_FALSE(f.route_diag);
  EXPECT_TRUE(f.ktrace_out.empty());
  EXPECT_EQ(f.cpu_threads, 0);
  EXPECT_FALSE(f.p2p_allreduce);
  EXPECT_FALSE(f.test_now.has_value());
  EXPECT_EQ(f.op_repeat_count("attn"), 1);
}

TEST(DebugFlags, ParsesEachType) {
  const DebugFlags f = parse_debug_flags(env_of({{"MOESERVE_PDL", "0"},
                                                 {"MOESERVE_PREFILL_OFF", "lt,fp8_act"},
                                                 {"MOESERVE_DECODE_OFF", "all"},
                                                 {"MOESERVE_DECODE_MEGA", "1"},
                                                 {"MOESERVE_CPU_THREADS", "3"},
                                                 {"MOESERVE_P2P_ALLREDUCE", "1"},
                                                 {"MOESERVE_TEST_NOW", "1700000000"},
                                                 {"MOESERVE_OP_REPEAT", "attn:0,experts:3"}}),
                                          true);
  EXPECT_FALSE(f.pdl);
  EXPECT_TRUE(f.prefill_off_has("lt"));
  EXPECT_TRUE(f.prefill_off_has("fp8_act"));
  EXPECT_FALSE(f.prefill_off_has("attn"));
  EXPECT_TRUE(f.decode_off_has("router"));  // "all"
  EXPECT_TRUE(f.decode_mega);
  EXPECT_EQ(f.cpu_threads, 3);
  EXPECT_TRUE(f.p2p_allreduce);
  EXPECT_EQ(f.test_now.value_or(0), 1700000000);
  EXPECT_EQ(f.op_repeat_count("attn"), 0);
  EXPECT_EQ(f.op_repeat_count("experts"), 3);
  EXPECT_EQ(f.op_repeat_count("qkv"), 1);
}

TEST(DebugFlags, BadValuesAreClearErrors) {
  EXPECT_NE(error_of({{"MOESERVE_PDL", "maybe"}}).find("MOESERVE_PDL=maybe: not a bool"), std::string::npos);
  EXPECT_NE(error_of({{"MOESERVE_CPU_THREADS", "x"}}).find("MOESERVE_CPU_THREADS=x: not an integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"MOESERVE_CPU_THREADS", "-1"}}).find("out of range"), std::string::npos);
  const std::string e = error_of({{"MOESERVE_PREFILL_OFF", "lt,attn_q8"}});
  EXPECT_NE(e.find("unknown item 'attn_q8'"), std::string::npos) << e;
  EXPECT_NE(e.find("accepted: fp8_act"), std::string::npos) << e;
  EXPECT_NE(error_of({{"MOESERVE_OP_REPEAT", "attn"}}, true).find("is not op:n"), std::string::npos);
  EXPECT_NE(error_of({{"MOESERVE_OP_REPEAT", "mlp:2"}}, true).find("unknown op 'mlp'"), std::string::npos);
}

TEST(DebugFlags, DiagnosticsOnlyInTheDiagnosticBuild) {
  for (const char* n : {"MOESERVE_OP_REPEAT", "MOESERVE_ROUTE_DIAG", "MOESERVE_MEGA_TIMING", "MOESERVE_KTRACE_OUT"}) {
    const std::string v = std::string(n) == "MOESERVE_OP_REPEAT" ? "attn:0" : "1";
    EXPECT_NE(error_of({{n, v}}, false).find("only in the diagnostic build"), std::string::npos) << n;
    EXPECT_EQ(error_of({{n, v}}, true), "") << n;
    const std::string off = v == "1" ? "0" : "";  // "off" is always accepted
    EXPECT_EQ(error_of({{n, off}}, false), "") << n;
  }
}

TEST(DebugFlags, HelpListsEveryFlagWithTypeAndDefault) {
  const std::string h = debug_flags_help();
  EXPECT_LE(debug_flag_specs().size(), 12u);  // issue 23: at most about 12
  for (const DebugFlagSpec& s : debug_flag_specs()) {
    EXPECT_NE(h.find(s.name), std::string::npos) << s.name;
    EXPECT_NE(std::string(s.description), "") << s.name;
    EXPECT_NE(std::string(s.default_text), "") << s.name;
  }
  EXPECT_NE(h.find("default"), std::string::npos);
}

}  // namespace
}  // namespace moeserve
