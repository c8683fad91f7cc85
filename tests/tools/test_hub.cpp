// Pure pieces of `moeserve pull`: glob filtering as huggingface_hub's fnmatch, cache naming,
// URL handling, Content-Range parsing, progress formatting, retry delays, cache files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tools/downloader.h"
#include "tools/hub_cache.h"
#include "tools/hub_client.h"
#include "tools/progress.h"

using namespace moeserve::hub;

TEST(Glob, StarCrossesSlashLikeFnmatch) {
  EXPECT_TRUE(glob_match("*.json", "config.json"));
  EXPECT_TRUE(glob_match("*.json", "a/b/c.json"));  // fnmatch: '*' matches '/'
  EXPECT_TRUE(glob_match("data/*.json", "data/a/b.json"));
  EXPECT_FALSE(glob_match("*.json", "config.json.bak"));
  EXPECT_FALSE(glob_match("*.JSON", "config.json"));  // case-sensitive
  EXPECT_TRUE(glob_match("model-0000?-of-00002.safetensors", "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(glob_match("tokenizer*", "tokenizer_config.json"));
  EXPECT_TRUE(glob_match("[mt]*", "model.bin"));
  EXPECT_FALSE(glob_match("[!mt]*", "model.bin"));
  EXPECT_TRUE(glob_match("[!mt]*", "config.json"));
  EXPECT_TRUE(glob_match("[a-c]x", "bx"));
  EXPECT_FALSE(glob_match("[a-c]x", "dx"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("?", ""));
  EXPECT_TRUE(glob_match("a*b*c", "a--b--b--c"));
  EXPECT_FALSE(glob_match("a*b*c", "a--b--b--"));
  EXPECT_TRUE(glob_match("[x", "[x"));  // unclosed class: literal '['
}

TEST(Glob, IncludeExcludeOrderAndDirectories) {
  const std::vector<std::string> none;
  EXPECT_TRUE(path_selected("a.bin", none, none));
  EXPECT_TRUE(path_selected("original/w.pth", {"original/"}, none));  // trailing '/' = everything under
  EXPECT_FALSE(path_selected("x/original/w.pth", {"original/"}, none));
  EXPECT_FALSE(path_selected("original/w.json", {"*.json"}, {"original/*"}));  // deny after allow
  EXPECT_TRUE(path_selected("w.json", {"*.json"}, {"original/*"}));
  EXPECT_FALSE(path_selected("w.bin", {"*.json", "*.safetensors"}, none));
  EXPECT_TRUE(path_selected("sub\\x.json", none, none));
  EXPECT_FALSE(path_selected("sub/x.json", none, {"sub\\"}));  // backslashes normalised
}

TEST(CacheNames, RepoFolderAndLinks) {
  EXPECT_EQ(repo_folder_name("Qwen/Qwen3-0.6B", "model"), "models--Qwen--Qwen3-0.6B");
  EXPECT_EQ(repo_folder_name("squad", "dataset"), "datasets--squad");
  EXPECT_EQ(snapshot_link_target("config.json", "abc"), "../../blobs/abc");
  EXPECT_EQ(snapshot_link_target("a/b/c.bin", "abc"), "../../../../blobs/abc");
  auto c = cache_layout("/c", "org/name", "model");
  EXPECT_EQ(c.blob("e").string(), "/c/models--org--name/blobs/e");
  EXPECT_EQ(c.lock("e").string(), "/c/.locks/models--org--name/e.lock");
  EXPECT_EQ(c.ref("refs/pr/1").string(), "/c/models--org--name/refs/refs/pr/1");
}

TEST(CacheNames, UnsafePathsRejected) {
  EXPECT_NO_THROW(check_repo_path("a/b.json"));
  for (const char* p : {"../x", "/etc/passwd", "a/../../x", "a//b", "a/./b", "", "a\\b", "dir/"})
    EXPECT_THROW(check_repo_path(p), moeserve::Error) << p;
}

TEST(Hashes, Sha256AndShapes) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(is_sha256(sha256_hex("")));
  EXPECT_FALSE(is_sha256("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"));
  EXPECT_TRUE(is_commit_sha("0123456789abcdef0123456789abcdef01234567"));
  EXPECT_FALSE(is_commit_sha("main"));
  EXPECT_EQ(normalize_etag("W/\"abc\""), "abc");
  EXPECT_EQ(normalize_etag("\"abc\""), "abc");
}

TEST(Hashes, GitBlobSha1Etag) {
  auto p = std::filesystem::temp_directory_path() / "moeserve_test_hub_git.txt";
  std::ofstream(p) << "hello\n";
  EXPECT_TRUE(git_etag_matches(p, "ce013625030ba8dba906f756967f9e9ca394464a"));  // `git hash-object`
  EXPECT_TRUE(git_etag_matches(p, "f572d396fae9206628714fb2ce00f72e94f2258f"));  // plain sha1
  EXPECT_FALSE(git_etag_matches(p, "0000000000000000000000000000000000000000"));
  std::ofstream(p) << "hellO\n";
  EXPECT_FALSE(git_etag_matches(p, "ce013625030ba8dba906f756967f9e9ca394464a"));
  std::filesystem::remove(p);
}

TEST(Urls, QuoteOriginJoinLink) {
  EXPECT_EQ(url_quote("refs/pr/1", ""), "refs%2Fpr%2F1");
  EXPECT_EQ(url_quote("dir/a b+c.json"), "dir/a%20b%2Bc.json");
  EXPECT_EQ(url_origin("http://127.0.0.1:8080/a/b?x"), "http://127.0.0.1:8080");
  EXPECT_NE(url_origin("http://127.0.0.1:8080/a"), url_origin("http://127.0.0.1:8081/a"));
  EXPECT_EQ(url_origin("HTTPS://Hub.Example:443/x"), url_origin("https://hub.example/y"));
  EXPECT_EQ(url_join("http://h:1/a/resolve/main/x", "/b/resolve/main/x"), "http://h:1/b/resolve/main/x");
  EXPECT_EQ(url_join("http://h:1/a/b", "https://cdn/x?sig=1"), "https://cdn/x?sig=1");
  EXPECT_EQ(link_next("<https://h/api/models/a/b/tree/main?cursor=xyz>; rel=\"next\""),
            "https://h/api/models/a/b/tree/main?cursor=xyz");
  EXPECT_EQ(link_next("<https://h/p1>; rel=\"prev\", <https://h/p3>; rel=\"next\""), "https://h/p3");
  EXPECT_EQ(link_next("<https://h/p1>; rel=\"prev\""), "");
  EXPECT_EQ(link_next(""), "");
}

TEST(Urls, ResolveUrlsFollowTheHubTemplate) {
  HubConfig cfg;
  cfg.endpoint = "http://mirror.local/";
  cfg.repo_id = "org/name";
  HubClient m(cfg);
  EXPECT_EQ(m.resolve_url("refs/pr/1", "sub dir/w.safetensors"),
            "http://mirror.local/org/name/resolve/refs%2Fpr%2F1/sub%20dir/w.safetensors");
  EXPECT_EQ(m.api_url("revision/main"), "http://mirror.local/api/models/org/name/revision/main");
  cfg.repo_type = "dataset";
  HubClient d(cfg);
  EXPECT_EQ(d.resolve_url("main", "x"), "http://mirror.local/datasets/org/name/resolve/main/x");
  cfg.token = "secret";
  HubClient t(cfg);
  auto has_auth = [](const std::vector<std::string>& h) {
    for (auto& s : h)
      if (s.rfind("Authorization:", 0) == 0) return true;
    return false;
  };
  EXPECT_TRUE(has_auth(t.headers_for("http://mirror.local/org/name/resolve/main/x")));
  EXPECT_FALSE(has_auth(t.headers_for("http://mirror.local:81/lfs/x")));
  EXPECT_FALSE(has_auth(t.headers_for("https://cdn-lfs.example/x")));
}

TEST(ContentRange, Parse) {
  int64_t a, b, t;
  ASSERT_TRUE(parse_content_range("bytes 100-199/1000", &a, &b, &t));
  EXPECT_EQ(a, 100);
  EXPECT_EQ(b, 199);
  EXPECT_EQ(t, 1000);
  ASSERT_TRUE(parse_content_range("bytes 0-0/*", &a, &b, &t));
  EXPECT_EQ(t, -1);
  EXPECT_FALSE(parse_content_range("bytes */1000", &a, &b, &t));
  EXPECT_FALSE(parse_content_range("bytes 5-4/10", &a, &b, &t));
  EXPECT_FALSE(parse_content_range("bytes 0-10/10", &a, &b, &t));
  EXPECT_FALSE(parse_content_range("items 0-1/10", &a, &b, &t));
}

TEST(Progress, Formatting) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(2.0 * (1 << 30)), "2.0 GiB");
  EXPECT_EQ(format_duration(5), "0:05");
  EXPECT_EQ(format_duration(62), "1:02");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(1.0 / 0.0), "--:--");
  const std::string l = format_bar_line("model.safetensors", 512, 1024, 256, 120);
  EXPECT_NE(l.find("model.safetensors"), std::string::npos);
  EXPECT_NE(l.find("[##########..........]"), std::string::npos);
  EXPECT_NE(l.find(" 50%"), std::string::npos);
  EXPECT_NE(l.find("512 B/1.0 KiB"), std::string::npos);
  EXPECT_NE(l.find("256 B/s"), std::string::npos);
  EXPECT_NE(l.find("ETA 0:02"), std::string::npos);
  // A long name is cut from the left so the numbers always fit.
  const std::string longl = format_bar_line(std::string(200, 'x') + "-00001.safetensors", 0, 10, 0, 80);
  EXPECT_LE(longl.size(), 80u);
  EXPECT_EQ(longl.rfind("...", 0), 0u);
  EXPECT_NE(longl.find("tensors ["), std::string::npos);
  EXPECT_NE(longl.find("ETA --:--"), std::string::npos);
}

TEST(Retry, BackoffGrowsAndIsCapped) {
  RetryPolicy p;
  p.base_delay_s = 1;
  p.max_delay_s = 8;
  EXPECT_NEAR(p.delay_for(1, 0), 1.0, 0.26);
  EXPECT_NEAR(p.delay_for(3, 0), 4.0, 1.01);
  EXPECT_LE(p.delay_for(30, 0), 10.0);
  EXPECT_EQ(p.delay_for(1, 7), 7.0);  // Retry-After wins
  EXPECT_EQ(p.delay_for(1, 1000), 60.0);
}

TEST(LocalDir, MetadataRoundTrip) {
  auto dir = std::filesystem::temp_directory_path() / "moeserve_test_hub_local";
  std::filesystem::remove_all(dir);
  init_local_dir(dir);
  write_local_metadata(dir, "sub/w.bin", "c0ffee", "e7a9");
  auto m = read_local_metadata(dir, "sub/w.bin");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->commit, "c0ffee");
  EXPECT_EQ(m->etag, "e7a9");
  EXPECT_GT(m->timestamp, 1.0e9);
  std::ifstream g(dir / ".cache/huggingface/.gitignore");
  std::string s;
  g >> s;
  EXPECT_EQ(s, "*");
  EXPECT_TRUE(std::filesystem::exists(dir / ".cache/huggingface/CACHEDIR.TAG"));
  EXPECT_FALSE(read_local_metadata(dir, "missing").has_value());
  std::filesystem::remove_all(dir);
}

TEST(Tokens, EnvironmentOrder) {
  auto dir = std::filesystem::temp_directory_path() / "moeserve_test_hub_home";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "token") << "from_file\n";
  setenv("HF_HOME", dir.c_str(), 1);
  unsetenv("HF_TOKEN");
  unsetenv("HUGGING_FACE_HUB_TOKEN");
  unsetenv("HF_TOKEN_PATH");
  unsetenv("HF_HUB_DISABLE_IMPLICIT_TOKEN");
  EXPECT_EQ(find_token(), "from_file");
  setenv("HUGGING_FACE_HUB_TOKEN", "legacy", 1);
  EXPECT_EQ(find_token(), "legacy");
  setenv("HF_TOKEN", "primary", 1);
  EXPECT_EQ(find_token(), "primary");
  setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1", 1);
  EXPECT_EQ(find_token(), "");
  unsetenv("HF_HUB_DISABLE_IMPLICIT_TOKEN");
  unsetenv("HF_TOKEN");
  unsetenv("HUGGING_FACE_HUB_TOKEN");
  EXPECT_EQ(hf_hub_cache(), dir.string() + "/hub");
  std::filesystem::remove_all(dir);
}
