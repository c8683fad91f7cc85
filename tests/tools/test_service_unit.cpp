// The systemd unit text and ExecStart quoting (the generated unit is also run through
// `systemd-analyze verify` in test_service.py).
#include <gtest/gtest.h>

#include "core/error.h"
#include "tools/service_unit.h"

using namespace moeserve::service;

TEST(ServiceUnit, QuotesExecArgsForSystemd) {
  EXPECT_EQ(quote_exec_arg("--port"), "--port");
  EXPECT_EQ(quote_exec_arg("/models/MiniMax-M2.5"), "/models/MiniMax-M2.5");
  EXPECT_EQ(quote_exec_arg(""), "\"\"");
  EXPECT_EQ(quote_exec_arg("a b"), "\"a b\"");
  EXPECT_EQ(quote_exec_arg("50%"), "\"50%%\"");
  EXPECT_EQ(quote_exec_arg("$HOME"), "\"$$HOME\"");
  EXPECT_EQ(quote_exec_arg("say \"hi\"\\n"), "\"say \\\"hi\\\"\\\\n\"");
  EXPECT_EQ(quote_exec_arg("line1\nline2"), "\"line1\\nline2\"");
  EXPECT_EQ(quote_exec_arg(";"), "\";\"");
  EXPECT_EQ(quote_exec_arg("{\"method\":\"ngram\"}"), "\"{\\\"method\\\":\\\"ngram\\\"}\"");
  EXPECT_EQ(quote_env_assignment("HF_HOME=/var/lib/x y"), "\"HF_HOME=/var/lib/x y\"");
  EXPECT_THROW(quote_env_assignment("NOEQUALS"), moeserve::Error);
  EXPECT_THROW(quote_env_assignment("BAD-NAME=1"), moeserve::Error);
}

TEST(ServiceUnit, GpusFromServeFlags) {
  EXPECT_EQ(gpus_from_serve_args({"/m"}), 1);
  EXPECT_EQ(gpus_from_serve_args({"/m", "--tensor-parallel-size", "4"}), 4);
  EXPECT_EQ(gpus_from_serve_args({"/m", "-tp", "4", "--data-parallel-size=2"}), 8);
  EXPECT_EQ(gpus_from_serve_args({"/m", "--tensor_parallel_size=2"}), 2);
  EXPECT_EQ(gpus_from_serve_args({"/m", "--device", "cpu"}), 0);
  EXPECT_THROW(gpus_from_serve_args({"/m", "-tp", "four"}), moeserve::Error);
}

TEST(ServiceUnit, UnitHasTheExpectedDirectives) {
  ServiceOptions o;
  o.name = "m25";
  o.exec_path = "/usr/local/bin/moeserve";
  o.user = "moeserve";
  o.serve_args = {"/models/m25", "--port", "8000", "-tp", "4", "--served-model-name", "minimax m2.5"};
  o.env = {"NCCL_IB_DISABLE=1"};
  const std::string u = make_service_unit(o);
  for (const char* line :
       {"Type=notify\n", "NotifyAccess=main\n", "Restart=on-failure\n", "TimeoutStartSec=2h\n", "LimitNOFILE=65536\n",
        "User=moeserve\n", "EnvironmentFile=-/etc/m25/env\n", "Environment=\"HF_HOME=/var/lib/m25/huggingface\"\n",
        "Environment=\"CUDA_VISIBLE_DEVICES=0,1,2,3\"\n", "Environment=\"NCCL_IB_DISABLE=1\"\n",
        "ExecStart=/usr/local/bin/moeserve serve /models/m25 --port 8000 -tp 4 --served-model-name \"minimax m2.5\"\n",
        "SyslogIdentifier=m25\n", "WantedBy=multi-user.target\n"})
    EXPECT_NE(u.find(line), std::string::npos) << line << "\n---\n" << u;
  o.cuda_visible_devices = "4,5,6,7";
  EXPECT_NE(make_service_unit(o).find("CUDA_VISIBLE_DEVICES=4,5,6,7"), std::string::npos);
  o.serve_args = {"/models/tiny", "--device", "cpu"};
  EXPECT_EQ(make_service_unit(o).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
  o.name = "bad name";
  EXPECT_THROW(make_service_unit(o), moeserve::Error);
  o.name = "ok";
  o.exec_path = "relative/moeserve";
  EXPECT_THROW(make_service_unit(o), moeserve::Error);
}
