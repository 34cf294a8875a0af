// The process's shared connections of one transport kind, by server (a socket path, or host and
// port): a connection stays while it is alive, idle or not, for the next transport to the same
// server; one that failed, or that has used all its handles, is forgotten. Conn has closed(),
// spent() and set_on_dead(fn) (fn runs once the connection has failed).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace libd {

template <class Conn>
class SessionRegistry {
 public:
  static SessionRegistry &get() {
    static SessionRegistry *s = new SessionRegistry();  // never destroyed: transports may outlive statics
    return *s;
  }
  std::shared_ptr<Conn> find(const std::string &key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    if (it->second->closed() || it->second->spent()) {
      map_.erase(it);
      return nullptr;
    }
    return it->second;
  }
  void put(const std::string &key, const std::shared_ptr<Conn> &conn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      map_[key] = conn;
    }
    Conn *raw = conn.get();
    conn->set_on_dead([this, key, raw] { forget(key, raw); });
  }

 private:
  void forget(const std::string &key, Conn *conn) {
    std::shared_ptr<Conn> gone;  // released outside the lock
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(key);
    if (it != map_.end() && it->second.get() == conn) {
      gone = std::move(it->second);
      map_.erase(it);
    }
  }

  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Conn>> map_;
};

}  // namespace libd
