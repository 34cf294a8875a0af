// Which part of a collection a listing shows, from OpenWhisk's query parameters as its controller
// reads them (RestApiCommons: stringToListLimit, stringToListSkip): `limit` 1-200 (0 means 200;
// 30 when absent) and `skip` 0 or more, each a 32-bit integer; anything else is a 400 naming
// the value and the collection.
#pragma once
#include <cstdint>
#include <string>

namespace scad {

constexpr int kDefaultListLimit = 30;
constexpr int kMaxListLimit = 200;

struct ListPage {
  int limit = kDefaultListLimit;
  int64_t skip = 0;
};

// limit and skip are the query's values (nullptr when absent). "" or OpenWhisk's message.
std::string parse_list_page(const std::string &collection, const std::string *limit, const std::string *skip,
                            ListPage *out);

}  // namespace scad
