// Checks of the paths a user hands strata, made before any work starts, so
// that a wrong path costs one clear line and no lost time: an input that is
// a directory, a FIFO, a device, unreadable or empty; an output whose
// directory is missing, read-only or full, or that names a directory. Each
// error names what the path is for (`what`, e.g. "config file") and the
// path, and keeps the errno's name where there is one.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

// `path` is a regular file that can be opened for reading and holds at
// least one byte. Refuses a directory, a FIFO, a socket or a device (a FIFO
// would block the reader), a missing or unreadable file, an empty one.
Status check_input_file(const std::string& path, std::string_view what);

// The whole of the regular file at `path` (check_input_file's rules), read
// with plain read(2), so that a read error is a Status, never an exception.
Result<std::string> read_input_file(const std::string& path, std::string_view what);

// `path` can be written as a file: it is not a directory or a special file,
// and its directory exists and takes new files now (check_directory_writable's
// probe, so a read-only or full filesystem fails here).
Status check_output_file(const std::string& path, std::string_view what);

// `path` is an existing directory in which files can be created now.
Status check_output_directory(const std::string& path, std::string_view what);

}  // namespace strata
