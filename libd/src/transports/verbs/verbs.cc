// rdma_uverbs (verbs): one-sided RDMA READ and WRITE to a memory element over libibverbs, on an
// RC queue pair of our own. Set-up: we authenticate on the memory element's tcp control
// connection (the same CHALLENGE/AUTH as tcp), then connect the queue pair through librdmacm
// with a one-shot ticket from that connection, or by exchanging handshake records on it; either
// way the server answers with a remote key scoped to our grant. The connection then stays open,
// idle, as the liveness channel (its closing means revoked or gone). Keys:
//   host, port, grant, secret   the memory element's control endpoint and grant (as for tcp)
//   dev, port_num, gid_index    device selection (default: discovered; see verbs/device.h)
//   depth        work requests in flight (default 64)
//   max_msg      largest single request; bigger transfers are split (default: the port's limit)
//   inline       writes up to this many bytes travel inside the request (IBV_SEND_INLINE), if
//                the device grants it; 0 turns it off (default 128, as UCX's rc transports)
//   poll         1: synchronous calls spin on the completion queue (latency) instead of
//                sleeping until the event loop sees the completion channel (default 0)
//   timeout_ms   per-operation deadline (default 10000)
//   setup        auto (default): rdma_cm when the memory element offers it and the route to its
//                host resolves to our device, else the record exchange; cm or oob: only that one
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/transport.h"
#include "transports/verbs/verbs_connect.h"
#include "ibv/device.h"

namespace libd {
namespace {

class VerbsTransport : public Transport {
 protected:
  bool configured() const override {
    return params_.has("host") && params_.has("port") && params_.has("grant") && params_.has("secret");
  }

  int do_init() override {
    if (!configured()) return set_error(-EINVAL, "needs host, port, grant and secret");
    uint64_t port, depth, max_msg, max_inline, doorbell_batch;
    if (int rc = params_.get_u64("port", 0, &port)) return rc;
    if (port == 0 || port > 65535) return set_error(-EINVAL, "parameter 'port' must be 1..65535");
    if (params_.get_or("secret", "").size() < 32) return set_error(-EINVAL, "parameter 'secret' is too short");
    if (int rc = params_.get_u64("depth", 64, &depth)) return rc;
    if (depth == 0 || depth > 16384) return set_error(-EINVAL, "parameter 'depth' must be 1..16384");
    if (int rc = params_.get_size("max_msg", 0, &max_msg)) return rc;
    if (int rc = params_.get_size("inline", 128, &max_inline)) return rc;
    if (max_inline > 4096) return set_error(-EINVAL, "parameter 'inline' must be 0..4096");
    if (int rc = params_.get_u64("doorbell_batch", 16, &doorbell_batch)) return rc;
    if (doorbell_batch > 4096) return set_error(-EINVAL, "parameter 'doorbell_batch' must be 0..4096");
    std::string poll = params_.get_or("poll", "0");
    if (poll != "0" && poll != "1") return set_error(-EINVAL, "parameter 'poll' must be 0 or 1");
    if (!ibv::parse_setup(params_.get_or("setup", "auto"), &setup_))
      return set_error(-EINVAL, "parameter 'setup' must be auto, cm or oob");
    if (int rc = ensure_device()) return rc;
    cfg_.depth = int(std::min<uint64_t>(depth, uint64_t(dev_->max_qp_wr())));
    cfg_.max_msg = dev_->max_msg();
    if (max_msg) cfg_.max_msg = uint32_t(std::min<uint64_t>(max_msg, cfg_.max_msg));
    cfg_.max_sge = std::min(dev_->max_sge(), 16);
    cfg_.poll_mode = poll == "1";
    cfg_.max_inline = int(max_inline);
    cfg_.doorbell_batch = int(doorbell_batch);
    return 0;
  }

  int do_register(char *buf, size_t size) override {
    if (int rc = ensure_device()) return rc;
    std::shared_ptr<ibv::Mr> mr;
    if (int rc = dev_->mrs().acquire(buf, size, IBV_ACCESS_LOCAL_WRITE, &mr)) return rc;
    if (driver_) driver_->set_local(mr);
    local_ = std::move(mr);
    return 0;
  }

  // One local registration (its key goes with every work request): a list is lent another way.
  int do_register_ranges(const std::vector<libd_range> &ranges) override {
    return set_error(-EOPNOTSUPP, "verbs registers one local buffer (one key for its work requests), not " +
                                      std::to_string(ranges.size()) + ": register them with a transport each");
  }

  int do_connect(Deadline deadline) override {
    ibv::Connected c;
    proto::Credentials creds{params_.get_or("grant", ""), params_.get_or("secret", ""), aid()};
    if (int rc = ibv::connect_driver(dev_, cfg_, params_.get_or("host", ""), params_.get_or("port", ""), creds,
                                       setup_, deadline, [this](int err, const std::string &why) { fail(err, why); }, &c))
      return rc;
    if (local_) c.driver->set_local(local_);
    driver_ = std::move(c.driver);
    set_remote(c.grant.offset, c.grant.length, c.grant.rights);
    return 0;
  }

  void do_disconnect() override {
    if (driver_) driver_->close(-ECONNABORTED, "the transport was closed");
    driver_.reset();
  }

  int do_post(const std::shared_ptr<Op> &op) override {
    driver_->post(op);  // it drives the operation: it cancels it, and may poll for it
    return 0;
  }

  int do_run(const std::shared_ptr<Op> &op, std::shared_lock<IoGate> &io) override {
    auto driver = driver_;
    io.unlock();  // a spinning caller must not keep recover/terminate waiting
    driver->run(op);
    return 0;
  }

  // The driver's own copy of the settings: cfg_ may be rewritten by configure() meanwhile, and
  // driver_ is stable under the shared I/O gate this is asked under.
  Caps caps() const override { return {.direct = driver_ && driver_->poll_mode(), .notify = true}; }

  int do_run_direct(OpKind kind, const Segment &seg, std::shared_lock<IoGate> &io, Deadline deadline,
                    std::string *why) override {
    uint64_t seq;
    bool pending;
    int rc;
    if (!driver_->start_direct(kind, seg, &seq, &pending, &rc, why)) return kNotDirect;
    if (!pending) return rc;  // the usual case over rxe: the doorbell's system call completed it
    auto driver = driver_;
    io.unlock();  // as in do_run: a spinning caller must not keep recover/terminate waiting
    return driver->finish_direct(seq, deadline, why);
  }

  int do_notify(uint64_t value, int status, bool, std::shared_lock<IoGate> &io, Deadline deadline) override {
    auto driver = driver_;
    io.unlock();
    return driver->notify(value, status, deadline);
  }

  void do_terminate() override {
    driver_.reset();
    local_.reset();
  }

 private:
  int ensure_device() {
    if (dev_) return 0;
    return ibv::Device::open(params_, &dev_);
  }

  // Destruction order matters: the driver (queue pair) and registration before the device.
  std::shared_ptr<ibv::Device> dev_;
  std::shared_ptr<ibv::Mr> local_;
  std::shared_ptr<ibv::QpDriver> driver_;
  ibv::QpDriver::Config cfg_;
  ibv::Setup setup_ = ibv::Setup::kAuto;
};

}  // namespace

extern const ImplInfo kVerbsImpl = {
    "rdma_uverbs", {"verbs"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new VerbsTransport()); }};

}  // namespace libd
