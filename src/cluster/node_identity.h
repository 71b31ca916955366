// What a node keeps of itself across restarts, in its state directory: its id, and (for
// clusters without a key) the secret this user's nodes on this machine share.
#pragma once

#include <string>

namespace strata::cluster {

// `given` when set; otherwise the id kept in `state_dir`/node-id, created there (random) the
// first time. An empty state_dir means $XDG_STATE_HOME/strata or ~/.local/state/strata.
std::string resolve_node_id(const std::string& given, const std::string& state_dir);

// The secret that the nodes of this user on this machine share when they have no cluster key:
// kept in local-secret in the default state directory ($XDG_STATE_HOME/strata or
// ~/.local/state/strata, whatever --state-dir says, so that every node of the user finds it),
// created there the first time, readable by this user only. Throws std::runtime_error when it
// cannot be kept, or when the file or its directory is another user's, others may read the
// file or write the directory, or the file is a link.
std::string read_or_create_local_secret();

}  // namespace strata::cluster
