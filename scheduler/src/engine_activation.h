// What the engine keeps of one activation while it runs, shared by the engine's files
// (engine.cc: start, run, the DAG and the record; engine_hosts.cc: hosts and placement;
// engine_runtime.cc: the runtime endpoint; engine_elements.cc: the life of memory elements and
// grants). Not part of the engine's interface.
#pragma once
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine.h"
#include "manifest.h"

namespace scad {

using nlohmann::json;

struct Activation {
  std::string id, ns, name, kind;  // kind: app | action | sequence
  std::string entity;               // the action's path in its namespace: "name" or "package/name"
  Engine::InvokeContext ctx;        // its caller's key (never stored), transaction, cause
  bool timed_out = false;
  json doc;                         // the app or action document
  json params;
  Manifest manifest;
  std::string code_key;             // "ns/kind/name/version": the agents keep one copy per version
  json code_files;
  int64_t requested_ms = 0;
  json record;
  std::vector<std::string> logs;
  using Placed = PlacedMemory;
  std::map<std::string, Placed> memory;            // manifest name -> element, alive during the activation
  std::map<std::string, Placed> runtime_elements;  // aid/name -> element (action.runtime.invoke)
  std::vector<std::string> tokens;
  bool done = false;
  int64_t first_start_ms = 0, init_ms = 0;
  std::map<std::string, int> starts;  // warm / prewarmed / cold: how its compute elements started
  // What each instance's transports moved and the time it took ("element#i" -> its transports).
  json transfers = json::object();
  struct Instance {  // a compute instance while it runs
    std::string element;
    int instance = 0, host = 0;
    std::string token;
    std::vector<std::string> memory;                     // manifest names of the memory it reaches
    std::vector<std::pair<int, std::string>> grants;     // (memory host, grant id)
  };
  std::map<std::string, Instance> instances;           // aid -> instance
  bool failed = false;                                 // an instance failed: start no more
  json wiring = json::object();       // "instance:durl" -> host it ran on (durl's impl: shm, verbs or tcp)
  std::mutex mu;
  std::condition_variable cv;
};

}  // namespace scad
