#include "proto/frame.h"

#include <cerrno>
#include <cstring>

#include "proto/le.h"

namespace libd::proto {
namespace {

void put16(char *p, uint16_t v) { put_le(p, v, 2); }
void put32(char *p, uint32_t v) { put_le(p, v, 4); }
void put64(char *p, uint64_t v) { put_le(p, v, 8); }
uint64_t get(const char *p, int n) { return get_le(p, n); }

}  // namespace

void encode_notify(uint64_t value, int status, char out[kHeaderSize], uint32_t handle) {
  Header h;
  h.opcode = kNotify;
  h.addr = value;
  h.status = status;
  h.req_id = with_handle(handle, 0);
  encode_header(h, out);
}

void encode_header(const Header &h, char out[kHeaderSize]) {
  put16(out, kMagic);
  out[2] = char(kVersion);
  out[3] = char(h.opcode);
  put32(out + 4, uint32_t(h.status));
  put64(out + 8, h.req_id);
  put64(out + 16, h.addr);
  put64(out + 24, h.size);
}

const char *opcode_name(uint8_t op) {
  switch (op) {
    case kChallenge: return "CHALLENGE";
    case kAuth: return "AUTH";
    case kAuthOk: return "AUTH_OK";
    case kRead: return "READ";
    case kReadResp: return "READ_RESP";
    case kWrite: return "WRITE";
    case kWriteResp: return "WRITE_RESP";
    case kPing: return "PING";
    case kPong: return "PONG";
    case kGoodbye: return "GOODBYE";
    case kVerbsConnect: return "VERBS_CONNECT";
    case kVerbsAccept: return "VERBS_ACCEPT";
    case kVerbsCmRequest: return "VERBS_CM_REQUEST";
    case kVerbsCmTicket: return "VERBS_CM_TICKET";
    case kNotify: return "NOTIFY";
    case kAttach: return "ATTACH";
    case kAttachOk: return "ATTACH_OK";
    case kDetach: return "DETACH";
    case kDetached: return "DETACHED";
    default: return "?";
  }
}

int decode_header(const char in[kHeaderSize], Header *out, std::string *why) {
  if (get(in, 2) != kMagic) { *why = "bad magic (not a Scad peer?)"; return -EPROTO; }
  if (uint8_t(in[2]) != kVersion) {
    *why = "protocol version " + std::to_string(uint8_t(in[2])) + " (this side speaks 1)";
    return -EPROTO;
  }
  Header h;
  h.opcode = uint8_t(in[3]);
  h.status = int32_t(uint32_t(get(in + 4, 4)));
  h.req_id = get(in + 8, 8);
  h.addr = get(in + 16, 8);
  h.size = get(in + 24, 8);
  if (h.opcode < kChallenge || h.opcode > kDetached) {
    *why = "unknown opcode " + std::to_string(h.opcode);
    return -EPROTO;
  }
  if (h.status > 0 || h.status < -4095) { *why = "status out of range"; return -EPROTO; }
  bool control = h.opcode == kChallenge || h.opcode == kAuth || h.opcode == kAuthOk ||
                 h.opcode == kVerbsConnect || h.opcode == kVerbsAccept || h.opcode == kVerbsCmRequest ||
                 h.opcode == kVerbsCmTicket || h.opcode == kAttach || h.opcode == kAttachOk;
  if (control && payload_length(h) > kMaxControlPayload) {
    *why = std::string(opcode_name(h.opcode)) + " body of " + std::to_string(h.size) + " bytes is too large";
    return -EPROTO;
  }
  if (h.size > kMaxDataPayload) { *why = "size " + std::to_string(h.size) + " over the 1 TiB limit"; return -EPROTO; }
  if (h.addr > UINT64_MAX - h.size) { *why = "address range wraps around"; return -EPROTO; }
  *out = h;
  return 0;
}

uint64_t payload_length(const Header &h) {
  switch (h.opcode) {
    case kChallenge:
    case kAuth:
    case kVerbsConnect:
    case kVerbsAccept:  // the server's record, or why it refused
    case kVerbsCmRequest:
    case kVerbsCmTicket:  // the cm port and ticket, or why not
    case kAttach:
    case kWrite: return h.size;
    case kAuthOk:
    case kAttachOk:
    case kReadResp: return h.status == 0 ? h.size : 0;
    default: return 0;
  }
}

int FrameReader::finish_payload(std::string *why) {
  in_payload_ = false;
  hdr_have_ = 0;
  int rc = handler_->on_frame(cur_);
  if (rc && why->empty()) *why = std::string("peer sent an unexpected ") + opcode_name(cur_.opcode);
  return rc;
}

int FrameReader::feed(const char *data, size_t n, std::string *why) {
  while (n > 0) {
    if (!in_payload_) {
      size_t take = std::min(n, kHeaderSize - hdr_have_);
      std::memcpy(hdr_ + hdr_have_, data, take);
      hdr_have_ += take, data += take, n -= take;
      if (hdr_have_ < kHeaderSize) return 0;
      if (int rc = decode_header(hdr_, &cur_, why)) return rc;
      dest_ = nullptr;
      if (int rc = handler_->on_header(cur_, &dest_)) {
        if (why->empty()) *why = std::string("peer sent an unexpected ") + opcode_name(cur_.opcode);
        return rc;
      }
      left_ = payload_length(cur_);
      done_ = 0;
      in_payload_ = true;
      if (left_ == 0) {
        if (int rc = finish_payload(why)) return rc;
      }
      continue;
    }
    size_t take = size_t(std::min<uint64_t>(n, left_));
    if (dest_) std::memcpy(dest_ + done_, data, take);
    done_ += take, left_ -= take, data += take, n -= take;
    if (left_ == 0) {
      if (int rc = finish_payload(why)) return rc;
    }
  }
  return 0;
}

bool FrameReader::direct_target(size_t min, char **ptr, size_t *len) const {
  if (!in_payload_ || !dest_ || left_ < min) return false;
  *ptr = dest_ + done_;
  *len = size_t(left_);
  return true;
}

int FrameReader::advance_direct(size_t n, std::string *why) {
  done_ += n;
  left_ -= n;
  if (left_ == 0) return finish_payload(why);
  return 0;
}

}  // namespace libd::proto
