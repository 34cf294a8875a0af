// A memory server's tcp connection (server_conn.h has what every kind shares): the server moves
// the bytes itself. READ is answered with the element's memory straight from where it lies
// (writev), WRITE's payload lands straight in it; the answers produced while one read from the
// socket is handled go out in one uv_write. A client that asks faster than it reads stops being
// read until its queue drains. The verbs handshake rides these connections (verbs_handshake.h).
#pragma once
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/server_conn.h"
#include "server/verbs_handshake.h"

namespace libd {

class TcpServerConn : public ServerConn {
 public:
  explicit TcpServerConn(MemoryServer *srv) : ServerConn(srv, false), verbs_(srv) {}
  // The rdma_cm request that presented this connection's ticket (the ticket is spent).
  void on_cm_connect(rdma_cm_id *id);
  // Also while answers wait for the kernel; their queue shrinking counts as bytes moved (libuv
  // says nothing of a write until all of it is out).
  bool mid_transfer() override {
    size_t queued = uv_stream_get_write_queue_size(stream());
    if (queued < sampled_queue_) note_activity();
    sampled_queue_ = queued;
    return ServerConn::mid_transfer() || queued > 0;
  }

 protected:
  void on_start() override;
  void on_close() override;
  int on_kind_header(const proto::Header &h, char **dest) override;
  int on_kind_frame(const proto::Header &h) override;
  void send_frame(const proto::Header &h, const std::string &body) override;
  void flush() override;
  bool sending(const Element *e) const override;
  void on_handle_cut(uint32_t handle) override;

 private:
  // One uv_write carrying every frame produced while handling one read from the socket: many
  // small answers cost one system call instead of one each.
  struct WriteReq {
    uv_write_t req;
    std::deque<std::array<char, proto::kHeaderSize>> hdrs;  // deque: stable addresses while growing
    std::deque<std::string> bodies;
    std::vector<uv_buf_t> bufs;
    std::vector<std::shared_ptr<Element>> elements;  // keeps READ data mapped until sent
    std::vector<Element *> io;  // one per READ answer with data: its Element::tcp_io count
    TcpServerConn *conn;
  };
  WriteReq *batch();
  // A READ answer: the header, then `data` (element's memory, sent from where it lies).
  void send_data(const proto::Header &h, char *data, const std::shared_ptr<Element> &element);
  bool in_batch(const Element *e) const;
  // A write is done with its elements.
  void unqueue(WriteReq *w);
  // The request's verdict (-ECONNRESET without an attachment), its element counted in
  // Element::tcp_io if it is admitted: counted before the grant is looked at.
  int check_io(Attachment *a, const proto::Header &h, unsigned need);
  // Gives back the Element::tcp_io counts of w's answers / of the WRITE payload being received.
  static void end_io(WriteReq *w);
  void end_write_io();
  void on_written(WriteReq *w, int status);

  VerbsHandshake verbs_;
  WriteReq *batch_ = nullptr;  // the answers batched so far
  int writes_ = 0;
  bool paused_ = false;
  size_t sampled_queue_ = 0;  // the write queue's size at mid_transfer's last look
  int write_status_ = 0;
  uint32_t payload_handle_ = 0;  // the attachment the WRITE payload being received is for
  std::shared_ptr<Element> write_io_;  // its element, counted in Element::tcp_io until it is in
  std::unordered_map<const Element *, int> queued_;  // elements whose memory batched or queued writes send
};

}  // namespace libd
