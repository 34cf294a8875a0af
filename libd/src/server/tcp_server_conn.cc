#include "server/tcp_server_conn.h"

#include <algorithm>

#include "io/tcp_congestion.h"
#include "libd.h"

namespace libd {

using namespace proto;

namespace {
constexpr size_t kPauseReadingAt = 64ull << 20;  // queued response bytes before we stop reading
constexpr size_t kResumeReadingAt = 16ull << 20;
}  // namespace

void TcpServerConn::on_start() {
  uv_tcp_nodelay(&h_.tcp, 1);
  uv_tcp_keepalive(&h_.tcp, 1, 10);
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t *>(&h_.tcp), &fd) == 0) restore_between_hosts(fd, srv_->tcp_congestion_);
}

void TcpServerConn::on_close() {
  if (batch_) end_io(batch_);  // never sent: nothing reads the memory for it
  delete batch_;
  batch_ = nullptr;
  end_write_io();
  verbs_.close();  // the client's remote key dies with its connection: revocation is immediate
}

int TcpServerConn::on_kind_header(const Header &h, char **dest) {
  switch (h.opcode) {
    case kRead:
    case kPing:
      return 0;
    case kWrite: {
      Attachment *a = attachment(h);
      write_status_ = check_io(a, h, LIBD_RIGHT_WRITE);
      payload_handle_ = session_ ? handle_of(h.req_id) : 0;
      if (write_status_ == 0) write_io_ = a->element;  // counted until the payload is in (or dropped)
      *dest = write_status_ == 0 ? a->element->at(h.addr, h.size) : nullptr;  // refused: drained
      return 0;
    }
    case kVerbsConnect:
    case kVerbsCmRequest:
      if (session_) return -EPROTO;  // a queue pair serves one grant: a plain connection's
      return verbs_.on_header(h, &ctl_, dest);
    default:
      return -EPROTO;
  }
}

int TcpServerConn::on_kind_frame(const Header &h) {
  Header r;
  r.req_id = h.req_id;
  switch (h.opcode) {
    case kPing:
      r.opcode = kPong;
      send_frame(r, {});
      return 0;
    case kWrite:
      end_write_io();
      r.opcode = kWriteResp;
      r.status = write_status_;
      r.size = h.size;
      send_frame(r, {});
      return 0;
    case kRead: {
      r.opcode = kReadResp;
      Attachment *a = attachment(h);
      r.status = check_io(a, h, LIBD_RIGHT_READ);
      r.size = h.size;
      bool serve = r.status == 0 && h.size > 0;
      if (r.status == 0 && !serve) a->element->io_end();  // nothing to send
      // A served answer carries the count until it is sent (unqueue) or dropped.
      send_data(r, serve ? a->element->at(h.addr, h.size) : nullptr, serve ? a->element : nullptr);
      return 0;
    }
    case kVerbsConnect:
    case kVerbsCmRequest: {
      auto grant = atts_.find(0);  // the AUTH grant: a plain connection's only one
      if (grant == atts_.end()) return -EPROTO;
      std::string body;
      verbs_.on_frame(this, h, ctl_, grant->second, &r, &body);
      send_frame(r, body);
      return 0;
    }
    default:
      return -EPROTO;
  }
}

void TcpServerConn::on_cm_connect(rdma_cm_id *id) {
  auto it = atts_.find(0);
  verbs_.on_cm_connect(id, closing_ || it == atts_.end() ? nullptr : &it->second);
}

void TcpServerConn::on_handle_cut(uint32_t handle) {
  if (reader_.in_payload() && reader_.current().opcode == kWrite && payload_handle_ == handle) {
    reader_.discard_current();  // the rest of that WRITE is dropped, and refused
    write_status_ = -ECONNRESET;
    end_write_io();
  }
}

int TcpServerConn::check_io(Attachment *a, const Header &h, unsigned need) {
  if (!a) return -ECONNRESET;
  a->element->io_begin();  // before the grant is looked at (Element::tcp_io)
  int rc = check(*a, h, need);
  if (rc) {
    a->element->io_end();
    if (!a->refused) a->refused = rc;  // the holder's word of success, if it comes, is this
  }
  return rc;
}

void TcpServerConn::end_write_io() {
  if (!write_io_) return;
  write_io_->io_end();
  write_io_.reset();
}

void TcpServerConn::end_io(WriteReq *w) {
  for (Element *e : w->io) e->io_end();
  w->io.clear();
}

// ---- answers ----

TcpServerConn::WriteReq *TcpServerConn::batch() {
  if (!batch_) {
    batch_ = new WriteReq();
    batch_->conn = this;
  }
  return batch_;
}

void TcpServerConn::send_frame(const Header &h, const std::string &body) {
  if (closing_) return;
  WriteReq *w = batch();
  w->hdrs.emplace_back();
  encode_header(h, w->hdrs.back().data());
  w->bufs.push_back(uv_buf_init(w->hdrs.back().data(), kHeaderSize));
  if (!body.empty()) {
    w->bodies.push_back(body);
    w->bufs.push_back(uv_buf_init(w->bodies.back().data(), unsigned(body.size())));
  }
  if (!in_read_) flush();
}

void TcpServerConn::send_data(const Header &h, char *data, const std::shared_ptr<Element> &element) {
  if (closing_) {
    if (data && h.size) element->io_end();
    return;
  }
  WriteReq *w = batch();
  w->hdrs.emplace_back();
  encode_header(h, w->hdrs.back().data());
  w->bufs.push_back(uv_buf_init(w->hdrs.back().data(), kHeaderSize));
  if (data && h.size) {
    if (std::find(w->elements.begin(), w->elements.end(), element) == w->elements.end()) {
      w->elements.push_back(element);
      queued_[element.get()]++;  // from the moment it is batched: a DETACH in the same read sees it
    }
    w->io.push_back(element.get());  // the count its request took (kept alive by `elements`)
    uv_buf_t b;
    b.base = data;
    b.len = size_t(h.size);
    w->bufs.push_back(b);
  }
  if (!in_read_) flush();
}

void TcpServerConn::flush() {
  WriteReq *w = batch_;
  batch_ = nullptr;
  if (!w) return;
  if (closing_) { unqueue(w); delete w; return; }
  w->req.data = w;
  writes_++;
  int rc = uv_write(&w->req, stream(), w->bufs.data(), unsigned(w->bufs.size()), [](uv_write_t *req, int status) {
    auto *w = static_cast<WriteReq *>(req->data);
    w->conn->on_written(w, status);
  });
  if (rc < 0) {
    writes_--;
    unqueue(w);
    delete w;
    close();
    return;
  }
  // Written to the kernel already (the usual case for answers that fit the socket's buffer):
  // nothing reads the memory for it any more, though its callback comes a loop pass later.
  if (uv_stream_get_write_queue_size(stream()) == 0) end_io(w);
  // A client that asks faster than it reads stops being read: its queue cannot grow forever.
  if (!paused_ && uv_stream_get_write_queue_size(stream()) > kPauseReadingAt) {
    paused_ = true;
    uv_read_stop(stream());
  }
}

void TcpServerConn::on_written(WriteReq *w, int status) {
  note_activity();  // a large answer leaves over several passes: poll on after it
  unqueue(w);
  delete w;
  writes_--;
  if (status < 0) { close(); return; }
  if (close_after_writes_ && writes_ == 0) { close(); return; }
  if (paused_ && uv_stream_get_write_queue_size(stream()) < kResumeReadingAt && !closing_) {
    paused_ = false;
    resume_reading();
  }
}

bool TcpServerConn::sending(const Element *e) const {
  auto it = queued_.find(e);
  return it != queued_.end() && (uv_stream_get_write_queue_size(&h_.stream) > 0 || in_batch(e));
}

bool TcpServerConn::in_batch(const Element *e) const {
  if (!batch_) return false;
  for (auto &x : batch_->elements)
    if (x.get() == e) return true;
  return false;
}

void TcpServerConn::unqueue(WriteReq *w) {
  end_io(w);
  for (auto &e : w->elements) {
    auto it = queued_.find(e.get());
    if (it == queued_.end() || --it->second > 0) continue;
    queued_.erase(it);
    release_drained(e.get());
  }
}

}  // namespace libd
