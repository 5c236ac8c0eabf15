//! The integration tests of `vallum-cli`, one binary: the dependency boundary of vallumctl
//! ([`dependencies`]), the `vallum-iptables` drop-in against real iptables and ufw ([`dropin`];
//! root), the generated completions and man pages ([`generated`]), and how vallum-iptables
//! starts: one thread, the local socket by default ([`start`]). Tests that need root or
//! a tool are `#[ignore = "needs ..."]`: `cargo test -p vallum-cli --test it -- --include-ignored`.

mod dependencies;
mod dropin;
mod generated;
mod start;
