//! The Linux adapters: every place vallumd talks to the host outside the engine's sync core.
//!
//! - [`sources`]: packet sources feeding one worker thread per core (NFQUEUE, pcap,
//!   synthetic); [`nfqueue_stats`]: what the kernel and our NFQUEUE workers did with each
//!   queued packet (/proc);
//! - [`local_addrs`] and [`routes`]: the node's addresses and routes over rtnetlink;
//! - [`kernel_tables`]: the tables handed to the kernel with `iptables-restore`;
//!   [`facts_chains`]: the steering's chains of kernel-decided matches (`--nfqueue-facts-mark`);
//!   [`steering`]: which hooks this node's packet path evaluates;
//! - [`local_socket`]: the local unix socket; [`allocator`]: the global allocator;
//!   [`owner_names`]: user and group names through NSS; [`conntrack_state`]: the connection
//!   table written at a graceful stop and read back at start.

pub mod allocator;
pub mod conntrack_state;
pub mod facts_chains;
pub mod kernel_tables;
pub mod local_addrs;
pub mod local_socket;
pub mod nfqueue_stats;
pub mod owner_names;
pub mod routes;
pub mod sources;
pub mod steering;
