// The one place that lists the transport implementations.
#pragma once
#include <string>
#include <vector>

#include "core/transport.h"

namespace libd {

// By canonical name or alias; nullptr if unknown.
const ImplInfo *find_impl(const std::string &name);
// "rdma_local (local), rdma_shm (shm), ..." for error messages.
std::string impl_names();

}  // namespace libd
