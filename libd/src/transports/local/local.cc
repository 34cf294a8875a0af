// rdma_local (local): a region inside this process. durl keys: size (required), region (a name
// shared by transports of this process), rights (r, w, rw; default rw).
// fake: the same with injected faults always on (core/fault_injector.h), for tests of the core and
// the bindings without a network; its data survives a reconnect, as a memory element's does.
#include <cerrno>

#include "core/error.h"
#include "core/transport.h"
#include "transports/local/region.h"

namespace libd {
namespace {

class LocalTransport : public Transport {
 public:
  explicit LocalTransport(bool fake = false) : keep_region_(fake) { faults_always_ = fake; }

 protected:
  bool configured() const override { return params_.has("size") || params_.has("region"); }

  int do_init() override {
    uint64_t size;
    if (int rc = params_.get_size("size", 0, &size)) return rc;
    if (size == 0 && !params_.has("region")) return set_error(-EINVAL, "parameter 'size' is required");
    return parse_rights(params_.get_or("rights", "rw"), &rights_);
  }

  int do_connect(Deadline) override {
    uint64_t size;
    if (int rc = params_.get_size("size", 0, &size)) return rc;
    if (!region_ || !keep_region_)
      if (int rc = Region::open(params_.get_or("region", ""), size, &region_)) return rc;
    set_remote(0, size ? size : region_->size(), rights_);
    return 0;
  }

  void do_disconnect() override {
    if (!keep_region_) region_.reset();
  }
  void do_terminate() override { region_.reset(); }

  Caps caps() const override { return {.inline_copy = true}; }

  int do_post(const std::shared_ptr<Op> &op) override {
    for (const auto &s : op->segments())
      copy_segment(region_->data(), op->kind() == OpKind::Read, s.size, s.raddr, s.buf);
    op->complete(0);
    return 0;
  }

 private:
  std::shared_ptr<Region> region_;
  unsigned rights_ = 0;
  bool keep_region_;
};

}  // namespace

extern const ImplInfo kLocalImpl = {
    "rdma_local", {"local"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new LocalTransport()); }};
extern const ImplInfo kFakeImpl = {
    "fake", {}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new LocalTransport(true)); }};

}  // namespace libd
