// Warm and pre-warmed compute processes, as OpenWhisk keeps containers: a process that ran an
// action stays for the same action (same code file, i.e. same application version, and function)
// for a keep-alive period; a small number of started processes (disagg and scad imported) wait
// for any action, so a cold start does not pay a process's start. In a sandbox (the agent root),
// processes with network are forked by the fork server (zygote.h), not each started afresh. Both bounded. A process is
// never shared between different actions, and one that crashed or timed out is never reused.
//
// A wide fan-out asks for many processes of one action at once. Where processes of that action
// are running and, at the pace its runs have gone, one would be free for this caller (after the
// callers already waiting) sooner than a newly started process would have done a run
// (interpreter start included), the caller waits that long (at most warm_wait_ms) for a released
// one, handed to it directly, instead of starting its own: a fan-out of 512 short instances then
// runs on the processes it has, as OpenWhisk's activations queue for a free container (no more
// than four callers queue per running process: past that one more is started). A caller
// that waited in vain starts one (no instance waits for another forever), and a long-running
// action's fan-out starts processes at once as before. When the idle processes kept reach
// max_warm, the one idle longest is ended to keep a newly released one.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace scad {

class Sandbox;
class Zygote;

struct WorkerOptions {
  std::string python, pythonpath, home;
  std::shared_ptr<const Sandbox> sandbox;  // null: processes run as the agent's children, unconfined
  int prewarm = 2;                // started interpreters waiting for any action
  int max_warm = 16;              // idle processes kept for their action
  int64_t keep_alive_ms = 60000;  // how long an idle warm process is kept
  int64_t warm_wait_ms = 500;     // the longest a caller waits for a running process of its action (0: never)
  // In a sandbox, with the agent running as root, processes with network are forked by a fork
  // server (zygote.h) that has the launcher imported, instead of each starting an interpreter.
  bool zygote = true;
};

struct Worker {
  pid_t pid = -1;
  int in = -1, out = -1, err = -1;
  // A process the fork server made is not the agent's child: it is signalled through its pidfd
  // and says how it ended on its status pipe.
  int pidfd = -1, status = -1;
  std::string status_text;  // read from `status` so far
  std::mutex in_mu;  // the run's spec and peer notices are written to `in` from different threads
  std::string key;   // the action it may serve again ("" while pre-warmed)
  std::string pending;  // stdout bytes after the last full line
  std::chrono::steady_clock::time_point idle_since;
  std::function<void(pid_t)> on_exit;  // after the process is reaped (leaves its cgroup)
  std::chrono::steady_clock::time_point acquired;
  bool started_cold = false;  // started for this run: its length includes the interpreter's start
  std::shared_ptr<void> busy;  // while acquired: counted among its action's running processes
  ~Worker();
  bool alive() const;  // its result pipe is still open: idle, it has not died
  // Whether the process (its pipes closed) ends by the deadline; one that does not is still up.
  bool ends_by(std::chrono::steady_clock::time_point deadline) const;
  void kill_now();  // SIGKILL: the process, and in a sandbox every process it started
  // Waits for the process to end: false if that cannot be known (it was reaped already). A
  // process the fork server could not set up says why in *why.
  bool reap(int *exit_code, int *signal, std::string *why = nullptr);
};

struct WorkerRun {
  bool died = false, timed_out = false;
  bool reply_too_long = false;  // the result line passed kMaxReplyBytes: the process was ended
  int exit_code = -1, signal = 0;
  std::string reply;   // the result line
  std::string stderr_text;      // the run's output, at most the run's output limit
  uint64_t output_dropped = 0;  // bytes of output past that limit, read and thrown away
};

// A result line longer than this ends the run (the launcher's results are far smaller; a line
// this long is user code writing to the result pipe).
constexpr size_t kMaxReplyBytes = 64u << 20;

// The pool outlives every worker it hands out (a worker's token refers to it): its owner ends the
// callers that hold workers (the agent's HTTP server, its threads joined) before the pool.
class WorkerPool {
 public:
  explicit WorkerPool(WorkerOptions o);
  ~WorkerPool();
  // A process for `key`: warm if one is idle, else pre-warmed, else newly started. *how says which.
  // Without `network` (a sandbox only), one started without network: never a pre-warmed one, and
  // warm only for the same key without network.
  std::unique_ptr<Worker> acquire(const std::string &key, std::string *how, bool network = true);
  // Gives it back after a run; unhealthy ones are ended.
  void release(std::unique_ptr<Worker> w, bool healthy);
  // Sends one spec line and waits for the result line. The run's output past max_output bytes is
  // read (so the process never blocks on a full pipe) and dropped.
  WorkerRun run(Worker &w, const std::string &line, int64_t timeout_ms, uint64_t max_output);
  // Sends one line to a running worker (a peer notice); false if it is gone.
  static bool send(Worker &w, const std::string &line);
  const WorkerOptions &options() const { return o_; }

 private:
  std::unique_ptr<Worker> spawn(bool network = true);
  std::unique_ptr<Worker> fork_from_zygote();  // null: spawn afresh
  std::vector<std::string> process_env() const;
  // Every process is started by the maintainer thread, which lives as long as the pool: a sandbox
  // dies with the thread that started it (bubblewrap's --die-with-parent is PR_SET_PDEATHSIG,
  // which follows the parent thread), and a caller's thread may end while its process stays warm.
  std::unique_ptr<Worker> spawn_on_maintainer(bool network);
  void maintain();  // starts processes asked for, tops up the pre-warmed pool, ends idle ones
  // Marks w acquired for key: counted running until it is released or ended.
  void mark_busy_locked(Worker *w, const std::string &key);
  // Whether a caller for key should wait for a running process of it to be released.
  bool worth_waiting_locked(const std::string &key) const;
  // How long a process started now would take to be done with a run (recent cold runs), at most
  // warm_wait_ms: the longest a caller waits for a sibling's process.
  double cold_estimate_ms_locked() const;
  double cold_ms_ = -1;  // recent runs on processes started for them (moving average); < 0: none yet

  WorkerOptions o_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<std::unique_ptr<Worker>> fresh_;
  std::multimap<std::string, std::unique_ptr<Worker>> warm_;
  struct SpawnRequest {
    std::promise<std::unique_ptr<Worker>> made;
    bool network;
  };
  std::deque<SpawnRequest *> spawn_requests_;
  struct PerAction {
    int running = 0;        // acquired and not yet released or ended
    double run_ms = -1;     // recent runs' length (moving average); < 0: none finished yet
    std::deque<std::unique_ptr<Worker> *> waiters;  // callers waiting for a released process, first come first
  };
  std::map<std::string, PerAction> actions_;
  std::unique_ptr<Zygote> zygote_;  // the maintainer thread's alone (it dies with the thread that started it)
  std::unique_ptr<Zygote> retired_zygote_;  // one that failed a request: its processes live on
  std::atomic<bool> zygote_failed_{false};  // a run found a forked process that could not be set up
  std::thread maintainer_;
};

}  // namespace scad
