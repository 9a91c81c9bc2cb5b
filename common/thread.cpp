#include "common/thread.h"

#include <pthread.h>

#include <string>

namespace strata {

void name_this_thread(std::string_view name) {
  std::string n(name.substr(0, 15));
  pthread_setname_np(pthread_self(), n.c_str());
}

}  // namespace strata
