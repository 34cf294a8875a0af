#include "server/memory_server.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <unordered_set>
#include <array>
#include <deque>
#include <vector>

#include "core/error.h"
#include "io/tcp_congestion.h"
#include "libd.h"
#include "proto/auth.h"
#include "proto/frame.h"
#include "server/cm_listener.h"
#include "server/tcp_server_conn.h"
#include "server/unix_server_conn.h"
#include "server/verbs_server.h"
#include "ibv/cm.h"
#include "ibv/record.h"

namespace libd {

using namespace proto;

Element::~Element() {
  if (base && !lent) munmap(base, size);
  if (memfd >= 0) close(memfd);
}

char *Element::at(uint64_t off, uint64_t len) const {
  if (ranges.empty()) return base + off;
  // The last range that starts at or before off.
  size_t i = size_t(std::upper_bound(starts.begin(), starts.end(), off) - starts.begin()) - 1;
  uint64_t in = off - starts[i];
  if (len > ranges[i].size - in) return nullptr;
  return reinterpret_cast<char *>(uintptr_t(ranges[i].base + in));
}

// ---- the server --------------------------------------------------------------------------

MemoryServer::MemoryServer() = default;

MemoryServer::~MemoryServer() {
  stop();
  if (cma_table_) munmap(cma_table_, size_t(cma_slots_) * sizeof(CmaSlot));
}

// A seqlock write, one writer (under mu_): seq odd while the fields change, even after.
void MemoryServer::cma_write_locked(int64_t slot, const Grant *g, const Element *e, int ended) {
  if (!cma_table_ || slot < 0 || slot >= int64_t(cma_slots_)) return;
  CmaSlot *c = &cma_table_[slot];
  uint64_t seq = __atomic_load_n(&c->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&c->seq, seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  if (g) {
    std::string tag = cma_tag(g->secret, g->id, g->client, !e->ranges.empty());
    // Several ranges: the slot points at their table (CmaSlot::ranges).
    c->base = e->ranges.empty() ? uint64_t(uintptr_t(e->base + g->offset)) : uint64_t(uintptr_t(e->ranges.data()));
    c->ranges = uint32_t(e->ranges.size());
    c->length = g->length;
    c->rights = g->rights;
    // No tag (hashing failed): the slot stays dead and holders ask the server instead.
    if (tag.size() == sizeof c->tag) std::memcpy(c->tag, tag.data(), sizeof c->tag);
    c->live = tag.size() == sizeof c->tag;
    c->ended = 0;
  } else {
    c->live = 0;
    c->ended = ended == -EKEYEXPIRED ? ended : 0;
    std::memset(c->tag, 0, sizeof c->tag);
    c->base = c->length = 0;
    c->rights = c->ranges = 0;
  }
  __atomic_store_n(&c->seq, seq + 2, __ATOMIC_RELEASE);
}

bool MemoryServer::drop_grant_locked(const std::string &id, int reason) {
  auto it = grants_.find(id);
  if (it == grants_.end()) return false;
  if (it->second.slot >= 0) {
    cma_write_locked(it->second.slot, nullptr, nullptr, reason);
    cma_free_.push_back(uint32_t(it->second.slot));
  }
  if (it->second.ended) it->second.ended->store(true, std::memory_order_seq_cst);
  auto of = element_grants_.find(it->second.element);
  if (of != element_grants_.end()) {
    of->second.erase(id);
    if (of->second.empty()) element_grants_.erase(of);
  }
  grants_.erase(it);
  return true;
}

void MemoryServer::cma_describe(GrantBody *body) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!cma_table_) return;
  body->cma_table = uint64_t(uintptr_t(cma_table_));
  body->cma_slots = cma_slots_;
}

size_t MemoryServer::cma_slots_used() {
  std::lock_guard<std::mutex> lk(mu_);
  return cma_table_ ? cma_slots_ - cma_free_.size() : 0;
}

int MemoryServer::add_element(const std::string &name, uint64_t size) {
  if (name.empty() || name.size() > 128) return set_error(-EINVAL, "element name must be 1..128 bytes");
  if (size == 0) return set_error(-EINVAL, "element '" + name + "': size must be > 0");
  std::lock_guard<std::mutex> lk(mu_);
  if (elements_.count(name)) return set_error(-EEXIST, "element '" + name + "' already exists");
  const uint64_t used = owned_bytes_;  // lent memory is the caller's, not the server's
  if (size > capacity_ - used)
    return set_error(-ENOSPC, "element '" + name + "' of " + std::to_string(size) + " bytes does not fit: " +
                                  std::to_string(capacity_ - used) + " bytes left of " + std::to_string(capacity_));
  auto e = std::make_shared<Element>();
  e->name = name;
  e->size = size;
  e->memfd = memfd_create(("scad-" + name).c_str(), MFD_CLOEXEC);
  if (e->memfd < 0) return set_error(-errno, std::string("memfd_create: ") + strerror(errno));
  // memfds are born mode 0777: anyone holding a read-only descriptor could reopen it writable
  // through /proc/self/fd. 0600 leaves reopening to the server's own uid.
  if (fchmod(e->memfd, 0600) != 0) return set_error(-errno, std::string("fchmod memfd: ") + strerror(errno));
  if (ftruncate(e->memfd, off_t(size)) != 0)
    return set_error(-ENOMEM, "element '" + name + "': cannot size memfd: " + strerror(errno));
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, e->memfd, 0);
  if (p == MAP_FAILED) return set_error(-ENOMEM, "element '" + name + "': mmap: " + strerror(errno));
  e->base = static_cast<char *>(p);
  elements_[name] = e;
  owned_bytes_ += size;
  return 0;
}

int MemoryServer::add_lent_element(const std::string &name, char *base, uint64_t size) {
  if (name.empty() || name.size() > 128) return set_error(-EINVAL, "element name must be 1..128 bytes");
  if (!base || size == 0) return set_error(-EINVAL, "element '" + name + "': lent memory needs an address and a size > 0");
  std::lock_guard<std::mutex> lk(mu_);
  if (elements_.count(name)) return set_error(-EEXIST, "element '" + name + "' already exists");
  auto e = std::make_shared<Element>();
  e->name = name;
  e->size = size;
  e->base = base;
  e->lent = true;
  elements_[name] = e;
  return 0;
}

int MemoryServer::add_lent_ranges(const std::string &name, const std::vector<CmaRange> &ranges) {
  if (name.empty() || name.size() > 128) return set_error(-EINVAL, "element name must be 1..128 bytes");
  if (ranges.empty() || ranges.size() > kMaxLentRanges)
    return set_error(-EINVAL, "element '" + name + "': lent ranges must number 1.." + std::to_string(kMaxLentRanges));
  auto e = std::make_shared<Element>();
  e->name = name;
  e->lent = true;
  e->ranges = ranges;
  e->starts.reserve(ranges.size());
  for (size_t i = 0; i < ranges.size(); i++) {
    const CmaRange &r = ranges[i];
    if (!r.base || r.size == 0 || r.base > UINT64_MAX - r.size || e->size > UINT64_MAX - r.size)
      return set_error(-EINVAL, "element '" + name + "': lent range " + std::to_string(i) +
                                    " needs an address and a size > 0");
    e->starts.push_back(e->size);
    e->size += r.size;
  }
  if (ranges.size() == 1) {  // one range is plain lent memory
    e->base = reinterpret_cast<char *>(uintptr_t(ranges[0].base));
    e->ranges.clear();
    e->starts.clear();
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (elements_.count(name)) return set_error(-EEXIST, "element '" + name + "' already exists");
  elements_[name] = e;
  return 0;
}

int MemoryServer::remove_element(const std::string &name) {
  bool sync = false, async = false, plain = false;
  std::unordered_set<std::string> gone;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = elements_.find(name);
    if (it == elements_.end()) return set_error(-ENOENT, "no element '" + name + "'");
    std::shared_ptr<Element> element = it->second;
    element->withdrawn->store(true, std::memory_order_release);
    elements_.erase(it);
    if (!element->lent) owned_bytes_ -= element->size;
    auto of = element_grants_.find(name);
    if (of != element_grants_.end()) gone = of->second;  // copied: drop_grant_locked edits the index
    for (const auto &id : gone) {
      holders_locked(id, &sync, &async, &plain);
      drop_notices_locked(id);
      forget_expiry_locked(id);
      drop_grant_locked(id);
    }
    if (sync && !plain && element->io_idle()) sync = false, async = true;  // after the grants' `ended`
  }
  // Connections over which the loop may still move its bytes let go of it before this returns;
  // with none (the holders detached, or only peers on this host, which move the bytes themselves
  // and find their grant gone before their next transfer, or tcp holders on sessions while
  // nothing of the element is on the move: their requests find the grants ended), nothing on the
  // loop reaches it.
  // By the grants dropped, not by the element's name: a cut the loop runs later must not reach an
  // element of the same name added meanwhile, nor its holders.
  cut_holders([gone = std::move(gone)](const Grant &g) { return gone.count(g.id) > 0; }, -ECANCELED, sync, async);
  return 0;
}

int MemoryServer::prefetch_element(const std::string &name) {
  int fd;
  uint64_t size;
  std::shared_ptr<const std::atomic<bool>> withdrawn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = elements_.find(name);
    if (it == elements_.end()) return set_error(-ENOENT, "prefetch: no element '" + name + "'");
    const Element &e = *it->second;
    if (e.lent || e.memfd < 0)
      return set_error(-EOPNOTSUPP, "prefetch: element '" + name + "' is lent memory: its pages are the lender's");
    // A descriptor of the prefetcher's own: the element may be withdrawn (and its memfd closed)
    // while a chunk is being allocated.
    fd = fcntl(e.memfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return set_error(-errno, std::string("prefetch: dup: ") + strerror(errno));
    size = e.size;
    withdrawn = e.withdrawn;
  }
  if (int rc = prefetcher_.add(fd, size, std::move(withdrawn)))
    return set_error(rc, rc == -EAGAIN ? "prefetch: no thread could be started for it" : "prefetch: the server is stopping");
  return 0;
}

uint64_t MemoryServer::used_bytes() {
  std::lock_guard<std::mutex> lk(mu_);
  return owned_bytes_;  // as libd_server_attr says: lent memory is not counted
}

int MemoryServer::grant(Grant *g) {
  if (g->client.empty()) return set_error(-EINVAL, "grant: client must be an action id or '*'");
  if (g->rights == 0 || g->rights > 3) return set_error(-EINVAL, "grant: rights must be read, write or both");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = elements_.find(g->element);
  if (it == elements_.end()) return set_error(-ENOENT, "grant: no element '" + g->element + "'");
  uint64_t size = it->second->size;
  if (g->length == 0 && g->offset <= size) g->length = size - g->offset;  // to the end
  if (g->offset > size || g->length > size - g->offset)
    return set_error(-ERANGE, "grant: range [" + std::to_string(g->offset) + ", +" + std::to_string(g->length) +
                                  ") is outside element '" + g->element + "' of " + std::to_string(size) + " bytes");
  if (!it->second->ranges.empty() && (g->offset != 0 || g->length != size))
    return set_error(-ERANGE, "grant: element '" + g->element + "' is lent as " +
                                  std::to_string(it->second->ranges.size()) + " ranges: a grant covers all of it");
  // A grant on a whole lent element gets a slot in the table for peers on this host (if there is
  // one, and a slot free), named in the id the server makes up.
  int64_t slot = -1;
  std::string fresh = random_bytes(40);  // 8 bytes of id, 32 of secret
  if (g->id.empty() && cma_table_ && !cma_free_.empty() && it->second->lent && g->offset == 0 && g->length == size) {
    slot = cma_free_.back();
    g->id = "g" + to_hex(fresh.substr(0, 8)) + "_" + std::to_string(slot);
  }
  if (g->id.empty()) g->id = "g" + to_hex(fresh.substr(0, 8));
  if (g->secret.empty()) g->secret = to_hex(fresh.substr(8));
  for (char c : g->id)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_')
      return set_error(-EINVAL, "grant id may hold letters, digits, '-' and '_' only");
  if (g->id.size() > 64 || g->secret.size() < 32 || g->secret.size() > 256)
    return set_error(-EINVAL, "grant: id up to 64 bytes, secret 32..256 bytes");
  if (grants_.count(g->id) || notices_.count(g->id)) return set_error(-EEXIST, "grant '" + g->id + "' already exists");
  g->slot = slot;
  g->ended = std::make_shared<std::atomic<bool>>(false);
  if (slot >= 0) {
    cma_free_.pop_back();
    cma_write_locked(slot, g, it->second.get());
  }
  grants_[g->id] = *g;
  element_grants_[g->element].insert(g->id);
  notices_[g->id] = Notices();
  if (g->ttl_ms && !stopped_) {
    auto at = std::chrono::steady_clock::now() + std::chrono::milliseconds(g->ttl_ms);
    expiry_of_[g->id] = expiry_q_.emplace(at, g->id);
    // The loop's timer is set for the earliest expiry; only a grant that expires sooner moves it
    // (posted, not waited for: this may even run on the loop thread).
    if (at < armed_for_) {
      armed_for_ = at;
      loop_.post([this] { arm_expiry(); });
    }
  }
  return 0;
}

bool MemoryServer::mid_transfer() {
  bool part_way = false;
  for (ServerConn *c : conns_) part_way = c->mid_transfer() || part_way;  // each samples its queue
  return part_way;
}

int MemoryServer::revoke(const std::string &grant_id) {
  bool sync = false, async = false, plain = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::shared_ptr<Element> element;
    auto g = grants_.find(grant_id);
    if (g != grants_.end()) {
      auto e = elements_.find(g->second.element);
      if (e != elements_.end()) element = e->second;
    }
    bool had = drop_grant_locked(grant_id);  // sets the grant's `ended` first
    auto it = notices_.find(grant_id);
    if ((it == notices_.end() || it->second.dropped) && !had) return set_error(-ENOENT, "no grant '" + grant_id + "'");
    drop_notices_locked(grant_id);  // an expired grant's record goes here too
    forget_expiry_locked(grant_id);
    holders_locked(grant_id, &sync, &async, &plain);
    if (sync && !plain && element && element->io_idle()) sync = false, async = true;  // after `ended`
  }
  cut_holders([grant_id](const Grant &g) { return g.id == grant_id; }, -ECANCELED, sync, async);
  return 0;
}

void MemoryServer::forget_expiry_locked(const std::string &grant_id) {
  auto it = expiry_of_.find(grant_id);
  if (it == expiry_of_.end()) return;
  expiry_q_.erase(it->second);  // the timer, if it was set for this one, finds nothing due and moves on
  expiry_of_.erase(it);
}

void MemoryServer::arm_expiry() {
  std::chrono::steady_clock::time_point next;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return;
    next = expiry_q_.empty() ? std::chrono::steady_clock::time_point::max() : expiry_q_.begin()->first;
    armed_for_ = next;
  }
  if (!expiry_timer_) {
    expiry_timer_ = new uv_timer_t;
    uv_timer_init(loop_.loop(), expiry_timer_);
    expiry_timer_->data = this;
  }
  if (next == std::chrono::steady_clock::time_point::max()) {
    uv_timer_stop(expiry_timer_);
    return;
  }
  uv_update_time(loop_.loop());
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now()).count() + 1;
  uv_timer_start(expiry_timer_, [](uv_timer_t *t) { static_cast<MemoryServer *>(t->data)->on_expiry_timer(); },
                 uint64_t(std::max<int64_t>(left, 1)), 0);
}

void MemoryServer::on_expiry_timer() {
  std::vector<std::string> expired;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto now = std::chrono::steady_clock::now();
    while (!expiry_q_.empty() && expiry_q_.begin()->first <= now) {
      std::string id = expiry_q_.begin()->second;
      expiry_q_.erase(expiry_q_.begin());
      expiry_of_.erase(id);
      if (!drop_grant_locked(id, -EKEYEXPIRED)) continue;
      end_notices_locked(id, -EKEYEXPIRED);
      if (attached_.count(id)) expired.push_back(id);
    }
  }
  for (const auto &id : expired) cut_locked_loop([&](const Grant &g) { return g.id == id; }, -EKEYEXPIRED);
  arm_expiry();
}

void MemoryServer::drop_notices_locked(const std::string &grant_id) {
  auto it = notices_.find(grant_id);
  if (it == notices_.end()) return;
  wake_locked(it->second);  // before it goes: its watchers learn the grant is over
  // ...and never hear of it again: their eventfds may be closed and their numbers reused once
  // the owner learns the grant is gone, while a waiter still keeps the record.
  it->second.watchers.clear();
  if (it->second.waiters > 0) {
    it->second.ended = -ECANCELED;  // the last waiter, once told, erases it
    it->second.dropped = true;
  } else {
    notices_.erase(it);
  }
  notices_cv_.notify_all();
}

void MemoryServer::wake_locked(Notices &n) {
  notices_cv_.notify_all();
  uint64_t one = 1;
  for (int fd : n.watchers) {
    ssize_t w = ::write(fd, &one, sizeof one);
    (void)w;  // EAGAIN: the counter is non-zero already, the watcher wakes anyway
  }
}

int MemoryServer::watch_notify(const std::string &grant_id, int fd, bool add) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = notices_.find(grant_id);
  if (it == notices_.end() || (add && it->second.dropped))
    return set_error(-ENOENT, "no grant '" + grant_id + "' (never granted, or revoked)");
  auto &w = it->second.watchers;
  w.erase(std::remove(w.begin(), w.end(), fd), w.end());
  if (add) {
    w.push_back(fd);
    // Something wait_notify would say already: the watcher hears it at once.
    if (!it->second.queue.empty() || it->second.lost || it->second.ended) wake_locked(it->second);
  }
  return 0;
}

void MemoryServer::end_notices_locked(const std::string &grant_id, int err) {
  auto it = notices_.find(grant_id);
  if (it != notices_.end() && it->second.ended == 0) it->second.ended = err;
  if (it != notices_.end()) wake_locked(it->second);
  notices_cv_.notify_all();
}

void MemoryServer::on_notice(const std::string &grant_id, const Notice &n) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = notices_.find(grant_id);
  if (it == notices_.end() || it->second.dropped) return;  // revoked: nobody is told any more
  it->second.queue.push_back(n);
  wake_locked(it->second);
}

int MemoryServer::take_attachment(const Grant &g, bool is_unix, bool session, std::shared_ptr<Element> *element) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!grants_.count(g.id)) return -EACCES;  // revoked or expired since it was found
  auto e = elements_.find(g.element);
  if (e == elements_.end()) return -ENOENT;
  if (is_unix && (g.offset != 0 || (g.length != 0 && g.length != e->second->size))) {
    // shm hands the client the element's whole memfd (or whole lent range): a grant on part of
    // an element can be honoured only where the server checks every access (tcp, verbs).
    return -EPERM;
  }
  if (is_unix && session && !e->second->lent) return -EOPNOTSUPP;  // a memfd cannot ride a shared socket's frames
  Held &held = attached_[g.id];
  (is_unix ? held.unix_ : held.tcp)++;
  if (!is_unix && !session) held.plain++;
  *element = e->second;
  return 0;
}

void MemoryServer::release_attachment(const std::string &grant_id, bool is_unix, bool session, bool lost) {
  std::lock_guard<std::mutex> lk(mu_);
  auto a = attached_.find(grant_id);
  if (a != attached_.end()) {
    (is_unix ? a->second.unix_ : a->second.tcp)--;
    if (!is_unix && !session) a->second.plain--;
    if (a->second.tcp == 0 && a->second.unix_ == 0) attached_.erase(a);
  }
  if (!lost) return;
  auto it = notices_.find(grant_id);
  if (it == notices_.end() || it->second.ended) return;  // closed by revoke/expiry, not by the holder
  it->second.lost++;
  wake_locked(it->second);
}

int MemoryServer::wait_notify(const std::string &grant_id, Notice *out, int timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  auto first = notices_.find(grant_id);
  if (first == notices_.end() || first->second.dropped)
    return set_error(-ENOENT, "no grant '" + grant_id + "' (never granted, or revoked)");
  first->second.waiters++;
  // The record outlives this wait (map nodes are stable); a revoked one goes with its last waiter.
  Notices &n = first->second;
  auto leave = [&](int rc) {
    if (--n.waiters == 0 && n.dropped) notices_.erase(grant_id);
    return rc;
  };
  while (true) {
    if (!n.queue.empty()) {
      *out = n.queue.front();
      n.queue.pop_front();
      return leave(0);
    }
    if (n.lost > 0) {
      n.lost--;
      return leave(set_error(-ECONNRESET, "a holder of grant '" + grant_id +
                                              "' closed its connection without saying it finished (it died or gave up)"));
    }
    if (n.ended == -EKEYEXPIRED) return leave(set_error(-EKEYEXPIRED, "grant '" + grant_id + "' expired"));
    if (n.ended) return leave(set_error(n.ended, "grant '" + grant_id + "' was revoked or its server stopped"));
    if (timeout_ms < 0) {
      notices_cv_.wait(lk);
    } else if (timeout_ms == 0 || notices_cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      // (A zero timeout only looks: a timed wait that is already over still sleeps out the
      // kernel's timer slack, some 50 us.)
      // One last look: a notice that raced the deadline is still delivered.
      if (!n.queue.empty() || n.lost > 0 || n.ended) continue;
      return leave(set_error(-ETIMEDOUT, "no word from the holder of grant '" + grant_id + "' within " +
                                             std::to_string(timeout_ms) + " ms"));
    }
  }
}

void MemoryServer::cut_locked_loop(const std::function<bool(const Grant &)> &pred, int reason, bool quiesce) {
  std::vector<ServerConn *> all(conns_.begin(), conns_.end());  // cut() may close (and unlist) one
  for (ServerConn *c : all) c->cut(pred, reason, quiesce);
}

void MemoryServer::cut(const std::function<bool(const Grant &)> &pred, int reason) {
  loop_.run_sync([&] { cut_locked_loop(pred, reason); });
}

void MemoryServer::cut_holders(std::function<bool(const Grant &)> pred, int reason, bool sync, bool async) {
  if (sync) {
    loop_waits_.fetch_add(1, std::memory_order_relaxed);
    cut(pred, reason);
  } else if (async) {
    // Nothing moves the grants' memory for these holders any more (peers on this host move it
    // themselves; tcp ones: Element::io_idle): they are told, the attachments let go of, later.
    loop_.post([this, pred = std::move(pred), reason] { cut_locked_loop(pred, reason, false); });
  }
}

std::shared_ptr<Element> MemoryServer::find_element(const std::string &name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = elements_.find(name);
  return it == elements_.end() ? nullptr : it->second;
}

bool MemoryServer::find_grant(const std::string &id, Grant *out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = grants_.find(id);
  if (it == grants_.end()) return false;
  *out = it->second;
  return true;
}

size_t MemoryServer::connections() { return nconns_.load(); }

size_t MemoryServer::holders(const std::string &grant_id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = attached_.find(grant_id);
  return it == attached_.end() ? 0 : size_t(it->second.tcp + it->second.unix_);
}

int MemoryServer::listen_tcp(const std::string &host, uint16_t port, uint16_t *bound) {
  int rc = 0;
  std::string why;
  loop_.run_sync([&] {
    if (tcp_listener_) { rc = -EALREADY; why = "already listening on tcp"; return; }
    struct sockaddr_storage addr;
    if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in *>(&addr)) != 0 &&
        uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6 *>(&addr)) != 0) {
      rc = -EINVAL;
      why = "'" + host + "' is not an IPv4 or IPv6 address";
      return;
    }
    auto *l = new uv_tcp_t;
    uv_tcp_init(loop_.loop(), l);
    l->data = this;
    if ((rc = uv_tcp_bind(l, reinterpret_cast<sockaddr *>(&addr), 0)) == 0) {
      // The connections it accepts inherit the listener's algorithm (tcp_congestion.h).
      uv_os_fd_t fd;
      if (uv_fileno(reinterpret_cast<uv_handle_t *>(l), &fd) == 0) tcp_congestion_ = prefer_unpaced(fd);
      rc = uv_listen(reinterpret_cast<uv_stream_t *>(l), 128, [](uv_stream_t *ls, int status) {
        if (status < 0) return;
        auto *srv = static_cast<MemoryServer *>(ls->data);
        auto *c = new TcpServerConn(srv);
        if (uv_accept(ls, c->stream()) == 0) c->start();
        else c->close();
      });
    }
    if (rc < 0) {
      why = "cannot listen on " + host + ":" + std::to_string(port) + ": " + uv_strerror(rc);
      uv_close(reinterpret_cast<uv_handle_t *>(l), [](uv_handle_t *h) { delete reinterpret_cast<uv_tcp_t *>(h); });
      return;
    }
    struct sockaddr_storage name;
    int len = sizeof name;
    uv_tcp_getsockname(l, reinterpret_cast<sockaddr *>(&name), &len);
    tcp_port_ = ntohs(name.ss_family == AF_INET ? reinterpret_cast<sockaddr_in *>(&name)->sin_port
                                                : reinterpret_cast<sockaddr_in6 *>(&name)->sin6_port);
    tcp_host_ = host;
    tcp_listener_ = l;
    start_cm();
  });
  if (rc) return set_error(rc, why);
  if (bound) *bound = tcp_port_;
  return 0;
}

int MemoryServer::listen_unix(const std::string &path) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path))
    return set_error(-EINVAL, "unix socket path must be 1.." + std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return set_error(-EEXIST, "'" + path + "' exists and is not a socket");
    unlink(path.c_str());  // a stale socket from a previous server
  }
  int rc = 0;
  std::string why;
  loop_.run_sync([&] {
    if (unix_listener_) { rc = -EALREADY; why = "already listening on a unix socket"; return; }
    auto *l = new uv_pipe_t;
    uv_pipe_init(loop_.loop(), l, 0);
    l->data = this;
    if ((rc = uv_pipe_bind(l, path.c_str())) == 0) {
      chmod(path.c_str(), 0660);
      rc = uv_listen(reinterpret_cast<uv_stream_t *>(l), 128, [](uv_stream_t *ls, int status) {
        if (status < 0) return;
        auto *srv = static_cast<MemoryServer *>(ls->data);
        auto *c = new UnixServerConn(srv);
        if (uv_accept(ls, c->stream()) == 0) c->start();
        else c->close();
      });
    }
    if (rc < 0) {
      why = "cannot listen on '" + path + "': " + uv_strerror(rc);
      uv_close(reinterpret_cast<uv_handle_t *>(l), [](uv_handle_t *h) { delete reinterpret_cast<uv_pipe_t *>(h); });
      return;
    }
    unix_listener_ = l;
    unix_path_ = path;
  });
  if (rc) return set_error(rc, why);
  std::lock_guard<std::mutex> lk(mu_);
  if (!cma_table_) {
    constexpr uint32_t kSlots = 4096;
    void *p = mmap(nullptr, size_t(kSlots) * sizeof(CmaSlot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {  // without one, peers on this host ask (ATTACH) as they do elsewhere
      cma_table_ = static_cast<CmaSlot *>(p);
      cma_slots_ = kSlots;
      for (uint32_t i = kSlots; i-- > 0;) cma_free_.push_back(i);
    }
  }
  return 0;
}

int MemoryServer::enable_verbs(const Params &params) {
  std::string cm = params.get_or("cm", "1");
  if (cm != "0" && cm != "1") return set_error(-EINVAL, "parameter 'cm' must be 0 or 1");
  std::unique_ptr<VerbsServer> v;
  if (int rc = VerbsServer::create(params, &v)) return rc;
  loop_.run_sync([&] {
    verbs_ = std::move(v);
    cm_wanted_ = cm == "1";
    if (!cm_wanted_) cm_status_ = "turned off (cm,0)";
    start_cm();
  });
  return 0;
}

void MemoryServer::start_cm() {
  if (cm_ || !verbs_ || !tcp_listener_ || !cm_wanted_ || stopped_) return;
  int rc = CmListener::create(loop_.loop(), tcp_host_,
                              [this](rdma_cm_id *id, const std::string &ticket) { on_cm_request(id, ticket); }, &cm_);
  if (rc) cm_status_ = last_error();
}

void MemoryServer::on_cm_request(rdma_cm_id *id, const std::string &ticket) {
  auto it = cm_tickets_.find(ticket);
  if (it == cm_tickets_.end()) {
    CmListener::reject(id, "unknown or spent ticket: ask for one on an authenticated control connection");
    return;
  }
  TcpServerConn *c = it->second;
  cm_tickets_.erase(it);
  c->on_cm_connect(id);
}

uint16_t MemoryServer::cm_port() {
  uint16_t port = 0;
  loop_.run_sync([&] { port = cm_ ? cm_->port() : 0; });
  return port;
}

std::string MemoryServer::verbs_description() {
  if (!verbs_) return "";
  std::string cm;  // cm_ and cm_status_ belong to the loop thread (set when listening, reset at stop)
  loop_.run_sync([&] { cm = cm_ ? ", rdma_cm port " + std::to_string(cm_->port()) : ", no rdma_cm (" + cm_status_ + ")"; });
  return verbs_->describe() + cm;
}

std::string MemoryServer::client_config(const Grant &g) const {
  // Appended in place (one allocation): a configuration is written for every grant made.
  std::string s;
  s.reserve(64 + tcp_host_.size() + unix_path_.size() + g.id.size() + g.secret.size());
  if (tcp_listener_) s.append("host,").append(tcp_host_).append(";port,").append(std::to_string(tcp_port_)).append(";");
  if (unix_listener_) s.append("path,").append(unix_path_).append(";");
  s.append("grant,").append(g.id).append(";secret,").append(g.secret);
  return s;
}

void MemoryServer::stop() {
  prefetcher_.stop();
  loop_.release();  // a lease an owner's polling thread holds: the loop's own thread stops it
  loop_.run_sync([&] {
    {
      std::lock_guard<std::mutex> lk(mu_);  // grant() reads it under mu_
      if (stopped_) return;
      stopped_ = true;
    }
    if (tcp_listener_)
      uv_close(reinterpret_cast<uv_handle_t *>(tcp_listener_), [](uv_handle_t *h) { delete reinterpret_cast<uv_tcp_t *>(h); });
    if (unix_listener_)
      uv_close(reinterpret_cast<uv_handle_t *>(unix_listener_), [](uv_handle_t *h) { delete reinterpret_cast<uv_pipe_t *>(h); });
    tcp_listener_ = nullptr;
    unix_listener_ = nullptr;
    std::vector<ServerConn *> all(conns_.begin(), conns_.end());
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto &[id, n] : notices_) {
        if (!n.ended) n.ended = -ECANCELED;  // the closings below are not losses
        wake_locked(n);
      }
      notices_cv_.notify_all();
    }
    for (ServerConn *c : all) c->close();
    {
      std::lock_guard<std::mutex> lk(mu_);
      expiry_q_.clear();
      expiry_of_.clear();
      for (auto &[id, g] : grants_)  // the grants stay for the owner to revoke; peers can no longer use them
        if (g.slot >= 0) cma_write_locked(g.slot, nullptr, nullptr);
    }
    if (expiry_timer_)
      uv_close(reinterpret_cast<uv_handle_t *>(expiry_timer_), [](uv_handle_t *h) { delete reinterpret_cast<uv_timer_t *>(h); });
    expiry_timer_ = nullptr;
    cm_.reset();  // after the connections: their endpoints own identifiers on its channel
  });
  if (!unix_path_.empty()) unlink(unix_path_.c_str());
  unix_path_.clear();
  // Let the close callbacks run before the loop (a member) is destroyed.
  loop_.run_sync([] {});
}

}  // namespace libd
