// The action object: an id, options, and the named transports of one compute element.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/params.h"
#include "core/transport.h"

struct libd_action {
  virtual ~libd_action() = default;
};

namespace libd {

class Action : public libd_action {
 public:
  // argv: "+key" "value" pairs (Scad's options). -EINVAL for anything else.
  static int create(const std::string &aid, int argc, char **argv, std::unique_ptr<Action> *out);
  ~Action() override;

  const std::string &id() const { return aid_; }
  int add_transport(const std::string &durl);
  int config_transport(const std::string &name, const std::string &config);
  Transport *get_transport(const std::string &name);
  std::string names() const;
  size_t count() const;

 private:
  std::string aid_;
  Params options_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Transport>> transports_;
};

}  // namespace libd
