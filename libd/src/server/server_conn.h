// One client connection of a memory server, on the server's loop thread: what every kind of
// connection shares. The peer proves it holds a grant (CHALLENGE, AUTH: proto/auth.h); a session
// attaches more grants and lets them go (ATTACH, DETACH: proto/frame.h, "Shared connections"); a
// holder's word (NOTIFY) reaches the grant's owner; the owner ending a grant cuts its holders off
// (cut). How the bytes move differs per kind and lives in the kind's own class:
// tcp_server_conn.h (READ and WRITE answered on the wire, and the verbs handshake that rides
// tcp connections, verbs_handshake.h) and unix_server_conn.h (the memfd handed over, or the
// owner's address for cross-memory attach: the peer moves the bytes itself).
#pragma once
#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proto/auth.h"
#include "proto/frame.h"
#include "server/memory_server.h"

namespace libd {

// A grant a connection carries. A plain connection carries its AUTH grant only (handle 0); a
// session any number of them.
struct Attachment {
  Grant grant;
  std::shared_ptr<Element> element;
  bool notified = false;  // the holder said it finished: its leaving is not a loss
  int refused = 0;        // the first request on it that was refused (a word of success after it is that)
};

class ServerConn : public proto::FrameReader::Handler {
 public:
  ServerConn(MemoryServer *srv, bool is_unix);
  ~ServerConn() override = default;

  uv_stream_t *stream() { return &h_.stream; }
  bool authed() const { return authed_; }
  // Sends the challenge and starts reading (the listener accepted the connection into stream()).
  void start();
  // Idempotent; the object deletes itself once its handles are closed.
  void close();
  // The owner ended the grants `pred` picks (revoked, expired, withdrawn): a plain connection
  // closes, a session ends those attachments and tells the client (DETACHED). A connection still
  // sending such a grant's memory (READ answers queued) closes too: once the owner's call returns,
  // nothing may read that memory any more. quiesce=false: the owner found that memory idle and
  // the grants ended (Element::io_idle), so nothing is closed for it.
  void cut(const std::function<bool(const Grant &)> &pred, int reason, bool quiesce = true);
  // Part way through moving bytes: a frame's payload partly received, or (the kind's) answers
  // not all handed to the kernel yet.
  virtual bool mid_transfer() { return reader_.in_payload(); }

  // proto::FrameReader::Handler: the opcodes every kind shares, then the kind's own.
  int on_header(const proto::Header &h, char **dest) final;
  int on_frame(const proto::Header &h) final;

 protected:
  // ---- what a kind adds ----
  virtual void on_start() {}
  virtual void on_close() {}
  // Opcodes other than AUTH, ATTACH, DETACH and NOTIFY: -EPROTO unless the kind serves them.
  virtual int on_kind_header(const proto::Header &, char **) { return -EPROTO; }
  virtual int on_kind_frame(const proto::Header &) { return -EPROTO; }
  // What the grant body of an admitted attachment says beyond its range and rights.
  virtual void describe(uint32_t, const Attachment &, proto::GrantBody *) {}
  // AUTH_OK with the grant body (a unix socket also passes the memfd).
  virtual void send_auth_ok(const proto::Header &r, const std::string &payload) { send_frame(r, payload); }
  virtual void send_frame(const proto::Header &h, const std::string &body) = 0;
  // Hands what was batched while one read from the socket was handled to the kernel.
  virtual void flush() {}
  // True while answers that send `e`'s memory are batched or not yet all handed to the kernel.
  virtual bool sending(const Element *) const { return false; }
  // An attachment the owner ended: a request for it that is arriving is dropped.
  virtual void on_handle_cut(uint32_t) {}

  // ---- for the kinds ----
  // The attachment a request names: on a session the top half of its req_id, else the AUTH grant.
  Attachment *attachment(const proto::Header &h);
  // 0 if the attachment's grant allows `need` on the request's range; -EACCES or -ERANGE, or
  // -ECONNRESET once the grant has ended (as for a request on an attachment already cut). A
  // request that moves memory counts itself first (Element::io_begin).
  static int check(const Attachment &a, const proto::Header &h, unsigned need);
  // Attachments detached while answers from `e`'s memory were queued are let go once nothing
  // queued sends it any more.
  void release_drained(const Element *e);
  // Hands the owner the held words whose grant's memory is no longer being sent.
  void release_held();
  // The read that just came in is handled: answers go out, NOTIFYs reach their owners.
  void read_handled();
  void note_activity();  // bytes moved: a polling server thread polls on (IoLoop::note_activity)
  // Reading again after the kind stopped it (uv_read_stop) to let its answers drain.
  void resume_reading() { uv_read_start(stream(), on_alloc, on_read); }

  MemoryServer *srv_;
  bool unix_;
  union Handle {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } h_;
  proto::FrameReader reader_;
  bool closing_ = false;
  bool close_after_writes_ = false;  // a refused AUTH: the answer goes out, then the connection closes
  bool session_ = false;             // AUTH asked for a shared connection
  bool in_read_ = false;             // answers are batched until the read (a burst of reads) is handled
  std::string ctl_;                  // the control body being received
  std::unordered_map<uint32_t, Attachment> atts_;

 private:
  // Headers and small payloads; what is left of a large payload is read straight into place, so the
  // smaller this is, the less of a large one is copied (8 KiB: a 64 KiB write's own read 3 µs
  // faster than with 64 KiB, a stream of small frames still several to a read).
  static constexpr size_t kStagingSize = 8 * 1024;
  static void on_alloc(uv_handle_t *h, size_t, uv_buf_t *buf);
  static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);
  // The burst of reads that filled their buffers is over (a short read, nothing more to read, or
  // the loop went on to other work): what was batched meanwhile goes out.
  void end_burst();
  // Checks an AUTH or ATTACH body against the grants and, if it opens one, attaches it as
  // `handle`. 0, or the status to answer (-EACCES for every refusal of the credentials alike: no
  // oracle for grant ids).
  int admit(uint32_t handle, proto::GrantBody *body);
  int on_auth();
  int on_attach(const proto::Header &h);
  int on_detach(const proto::Header &h);
  int on_notify(const proto::Header &h);
  void deliver_notices();

  uv_timer_t auth_timer_;
  // Runs after the loop's I/O phase while a burst of reads holds the answers: libuv reads a full
  // buffer's successors at once but gives up after a few, and then nothing else may end the burst.
  uv_check_t burst_end_;
  bool in_burst_ = false;
  int pending_closes_ = 0;
  std::string nonce_;
  bool got_auth_ = false, authed_ = false;
  uint64_t auth_flags_ = 0;
  std::vector<Attachment> draining_;  // detached while their READ answers were queued: still held
  std::vector<std::pair<std::string, Notice>> notices_;  // NOTIFYs of the read being handled
  // NOTIFYs that came while READ answers from their grant's memory were still queued: the owner
  // hears once those are sent (it may reuse the memory as soon as it hears).
  struct HeldNotice {
    const Element *element;
    std::string grant;
    Notice notice;
  };
  std::vector<HeldNotice> held_;
  char staging_[kStagingSize];
};

}  // namespace libd
