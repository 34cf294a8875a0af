// The standalone memory element server as a real process: killed, it is an error within the
// deadline (never a hang); restarted, recover() works again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "harness.h"

extern char **environ;

using nlohmann::json;
using namespace std::chrono;

namespace {

class Memd {
 public:
  Memd(std::vector<std::string> args) {
    int out[2];
    EXPECT_EQ(0, pipe2(out, O_CLOEXEC));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    args.insert(args.begin(), LIBD_MEMD_PATH);
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(0, posix_spawn(&pid_, LIBD_MEMD_PATH, &fa, nullptr, argv.data(), environ));
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    std::string line;
    char c;
    pollfd pf{out[0], POLLIN, 0};
    while (poll(&pf, 1, 10000) > 0 && read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    ready = json::parse(line, nullptr, false);
  }
  ~Memd() { kill(SIGKILL); }
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  json ready;

 private:
  pid_t pid_ = -1;
};

std::string read_config(const std::string &grants_file, const std::string &client) {
  std::ifstream in(grants_file);
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line);
    if (j["client"] == client) return j["config"];
  }
  return "";
}

// The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range).
int ephemeral_ports_from() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return in >> low && low > 11000 ? low : 32768;
}

double ms_since(steady_clock::time_point t0) { return duration<double, std::milli>(steady_clock::now() - t0).count(); }

}  // namespace

class KilledServer : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Impl, KilledServer, ::testing::Values("shm", "tcp"), [](const auto &i) { return i.param; });

TEST_P(KilledServer, IsAnErrorWithinTheDeadlineAndRecoverWorksOnceBack) {
  std::string base = test::unique_socket_path("memd");
  std::string sock = base, grants = base + ".grants";
  unlink(grants.c_str());
  std::vector<std::string> args = {"--element", "mem1=8MiB", "--tcp", "", "--unix", sock,
                                   "--grant", "mem1:client-1:rw", "--grants", grants};
  // The server comes back on the same port. One the kernel hands out (":0", or a connection's
  // source port) could be taken by another test while it is down: the port is chosen below the
  // kernel's ephemeral range, where only a test's own choice could land.
  std::unique_ptr<Memd> memd;
  std::mt19937 pick(std::random_device{}());
  int below = std::min(ephemeral_ports_from(), 65536) - 10000;
  for (int attempt = 0; attempt < 20 && !(memd && memd->ready.contains("tcp")); ++attempt) {
    unlink(grants.c_str());
    args[3] = "127.0.0.1:" + std::to_string(below + int(pick() % 9000));
    memd = std::make_unique<Memd>(args);
  }
  ASSERT_TRUE(memd->ready.contains("tcp")) << memd->ready.dump();
  struct stat st;
  ASSERT_EQ(0, stat(grants.c_str(), &st));
  EXPECT_EQ(0600u, st.st_mode & 0777) << "the grants file holds secrets";
  std::string config = read_config(grants, "client-1");
  ASSERT_FALSE(config.empty());

  auto a = test::make_action("client-1", {"+timeout_ms", "1000"});
  std::string durl = "mem1;" + GetParam();
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str()));
  auto *t = libd_action_get_transport(a.get(), "mem1");
  ASSERT_EQ(0, libd_action_config_transport(a.get(), "mem1", config.c_str()));  // as relayed by the control plane
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 1 << 20, reinterpret_cast<void **>(&buf)));
  test::fill_random(buf, 1 << 20, 3);
  ASSERT_EQ(0, libd_trdma_write(t, 1 << 20, 0, buf)) << libd_last_error();

  memd->kill(SIGKILL);
  auto t0 = steady_clock::now();
  int rc = libd_trdma_read(t, 1 << 20, 0, buf);
  // shm maps the memory itself, so reads still work until its watch sees the socket close (the
  // loop thread may wait for a core on a loaded machine): keep reading, within the deadline.
  while (rc == 0 && ms_since(t0) < 2000) rc = libd_trdma_read(t, 1 << 20, 0, buf);
  EXPECT_TRUE(rc == -ECONNRESET || rc == -ENOTCONN || rc == -ETIMEDOUT) << rc << " " << libd_last_error();
  EXPECT_LT(ms_since(t0), 2000.0) << "must fail within the deadline";
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(t));
  EXPECT_LT(libd_transport_recover(t), 0) << "nobody is there yet";

  // Restart on the same addresses, restoring the grants it handed out.
  std::string addr = memd->ready["tcp"];
  args[3] = addr;
  memd = std::make_unique<Memd>(args);
  ASSERT_TRUE(memd->ready.contains("tcp")) << memd->ready.dump();
  ASSERT_EQ(0, libd_transport_recover(t)) << libd_last_error();
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(t));
  ASSERT_EQ(0, libd_trdma_read(t, 4096, 0, buf)) << libd_last_error();
  EXPECT_EQ(std::string(4096, '\0'), std::string(buf, 4096)) << "a restarted element starts zeroed";
  unlink(grants.c_str());
}

TEST(Memd, RefusesBadArgumentsClearly) {
  Memd m({"--element", "x=lots", "--grants", "/tmp/never"});
  EXPECT_TRUE(m.ready.is_discarded());  // it printed nothing on stdout and exited
}
