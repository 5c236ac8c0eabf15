//! `vallumd`'s configuration: every flag has an environment twin `VALLUM_*` (clap `env`).
//!
//! Tests build a [`Config`] with [`Config::from_args`] (or [`Config::default`]), which never
//! reads the process environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::mark_field::{parse_facts_mark, parse_reject_mark};

use crate::grpc::auth::AuthConfig;
use crate::grpc::limits::LimitsConfig;
use crate::grpc::tls::ServerTlsArgs;
use crate::telemetry::metrics::MetricsConfig;

/// The barrier strategy of the packet path (see the engine's `dataplane` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Barrier {
    /// `fence(SeqCst)` on both sides.
    Seqcst,
    /// Compiler fences in workers, `membarrier(2)` in the committer (falls back to seqcst).
    Membarrier,
}

impl From<Barrier> for BarrierStrategy {
    fn from(b: Barrier) -> Self {
        match b {
            Barrier::Seqcst => BarrierStrategy::SeqCst,
            Barrier::Membarrier => BarrierStrategy::Membarrier,
        }
    }
}

/// What vallumd does when a stored active revision does not load at start
/// (`--on-load-failure`; see [`crate::control::pipeline::Pipeline::load`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLoadFailure {
    /// Exit with ACTIVE_REVISION_NOT_LOADED before SERVING (the default: never run with less
    /// than the store says is active). The revision is marked and audited first.
    #[default]
    Refuse,
    /// Serve the rulesets that loaded; the failed one is marked, audited, counted in
    /// `vallum_rulesets_not_loaded`, listed by GetStatus and NOT_SERVING under the health
    /// name `rulesets/NAME` until a new revision of it is committed or it is deleted.
    Degraded,
}

/// Where the workers' packets come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// No traffic: workers are not started.
    None,
    /// A pcap or pcapng file, read at start and replayed in a loop.
    Pcap(PathBuf),
    /// The engine's deterministic synthetic generator.
    Synthetic,
    /// Real packets from NFQUEUE (Linux): worker k binds queue `first + k`.
    Nfqueue(NfqueueSource),
}

/// `--source nfqueue[:FIRST][,fail-closed]`: the queues `FIRST..FIRST+cores-1` (FIRST
/// defaults to 0), steered by `vallumctl dataplane install` with the same numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfqueueSource {
    /// The first queue number.
    pub first: u16,
    /// Without it the queues are bound with `NFQA_CFG_F_FAIL_OPEN`: when a queue is full the
    /// kernel accepts new packets instead of dropping them (as `--queue-bypass` does while no
    /// worker is bound). `fail-closed` drops them.
    pub fail_closed: bool,
    /// The queue length to bind with (`--queue-maxlen`); `None`: the default of
    /// [`crate::host::nfqueue_stats::auto_maxlen`], under which every fail-open bypass is counted.
    pub maxlen: Option<u32>,
    /// Test only: the pause each worker takes after each batch
    /// (`--test-nfqueue-batch-delay-us`); `None` in production.
    pub batch_delay: Option<Duration>,
}

impl FromStr for NfqueueSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (head, fail_closed) = match s.strip_suffix(",fail-closed") {
            Some(h) => (h, true),
            None => (s, false),
        };
        let first = match head.strip_prefix("nfqueue") {
            Some("") => 0,
            Some(n) => n
                .strip_prefix(':')
                .and_then(|n| n.parse::<u16>().ok())
                .ok_or_else(|| format!("{s:?}: the first queue must be a number 0..65535"))?,
            None => return Err(format!("{s:?} is not nfqueue[:FIRST][,fail-closed]")),
        };
        Ok(NfqueueSource {
            first,
            fail_closed,
            maxlen: None,
            batch_delay: None,
        })
    }
}

/// What vallumd's ACCEPT means with `--source nfqueue` (`--nfqueue-mode`, `--nfqueue-mark`),
/// matching the steering rules of `vallumctl dataplane install --mode MODE --mark BIT`.
///
/// A queued packet waits in the kernel at the steering jump (`-j VALLUM-NFQUEUE` at the top of
/// INPUT, FORWARD, OUTPUT); what our verdict does with the kernel's own rules after that jump
/// (ufw's chains, DOCKER-USER, kube-proxy's KUBE-*) is the choice:
/// - [`NfqueueAccept::Final`]: ACCEPT is `NF_ACCEPT`: the packet leaves the filter table's
///   hook at once, so the kernel's rules after the jump are skipped for it (our ACCEPT is the
///   host's ACCEPT);
/// - [`NfqueueAccept::Continue`]: ACCEPT is `NF_REPEAT` with the packet's mark OR `mark`
///   (`NFQA_MARK`): the kernel runs the hook's table again from its first rule, the steering
///   chain RETURNs for a packet with that bit (`-m mark --mark B/B -j RETURN`), and the kernel's
///   remaining rules decide. Only our bit is set: the rest of the mark (the user's, or what our
///   rules' `-j MARK` left) is kept, and the bit stays on the packet afterwards (the kernel
///   cannot be asked to clear it; routing rules and `CONNMARK --save-mark` that read the mark
///   should mask it out).
///
/// DROP is `NF_DROP` in both; REJECT is handed to the kernel's own REJECT rules
/// ([`NfqueueAnswers::reject_mark`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NfqueueAccept {
    /// Our ACCEPT ends the hook (`NF_ACCEPT`), the default and what vallumd always did.
    #[default]
    Final,
    /// Our ACCEPT hands the packet back to the kernel's chain (`NF_REPEAT` with this bit set
    /// in the mark; exactly one bit).
    Continue {
        /// The mark bit the steering chain skips.
        mark: u32,
    },
}

/// How vallumd answers a queued packet with `--source nfqueue`: what its ACCEPT means
/// (`--nfqueue-mode`, `--nfqueue-mark`) and how its REJECT reaches the kernel
/// (`--nfqueue-reject-mark`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfqueueAnswers {
    /// What ACCEPT means.
    pub accept: NfqueueAccept,
    /// The mark field of the REJECT answers: 4 contiguous bits (default
    /// [`DEFAULT_REJECT_MARK`]), or 0 for none. A REJECT verdict is answered `NF_REPEAT` with
    /// this field of the packet's mark set to the answer's
    /// [`RejectWith::code`](vallum_engine::model::RejectWith::code) (the rest of the mark as
    /// our rules left it); the steering chain of `vallumctl dataplane install --reject-mark`
    /// (same value) sends such a packet, before it reaches the NFQUEUE rule again, to one
    /// kernel `-j REJECT --reject-with TYPE` per code after clearing the field, so the
    /// kernel itself builds the answer (ICMP type and code, TCP RST sequence numbers, no
    /// answer to an error or RST, its ICMP rate limit). With 0 a REJECT is `NF_DROP` (silent).
    pub reject_mark: u32,
    /// The facts field (`--nfqueue-facts-mark`): contiguous bits, or 0 for none. The steering's
    /// `VALLUM-FACTS-<HOOK>` chains set bit `i` of it when the kernel-decided expression of
    /// bit `i` holds for the packet ([`vallum_engine::kernel_decided`]); the packet path reads
    /// the field as [`vallum_engine::packet::PacketFacts::kernel_facts`] and the rules see the
    /// mark without it (the verdict's mark leaves it cleared).
    pub facts_mark: u32,
}

/// The default `--nfqueue-reject-mark` (and `vallumctl dataplane install --reject-mark`):
/// bits 24 to 27, outside the bits kube-proxy (0x4000, 0x8000), Docker, ufw, firewalld,
/// Cilium (0x0f00), Istio (0x539), wg-quick (0xca6c), Tailscale (0xff0000) and the continue
/// bit use; with Calico (mask 0xffff0000) pick a field below 0x10000.
pub const DEFAULT_REJECT_MARK: u32 = 0x0f00_0000;

/// `--nfqueue-mode`: see [`NfqueueAccept`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NfqueueMode {
    /// Our ACCEPT is the host's ACCEPT (`NF_ACCEPT`).
    #[default]
    Final,
    /// Our ACCEPT returns the packet to the kernel's rules after the steering jump
    /// (`NF_REPEAT` with `--nfqueue-mark`).
    Continue,
}

/// The default mark bit of `--nfqueue-mode continue` (and of `vallumctl dataplane install
/// --mode continue`): bit 30, outside the bits kube-proxy (0x4000, 0x8000), Docker, ufw,
/// Cilium (0x0f00), Istio (0x539) and wg-quick (0xca6c) use; Calico's default mask
/// (0xffff0000) covers it, so with Calico pick a bit outside Calico's `iptablesMarkMask`.
pub const DEFAULT_CONTINUE_MARK: u32 = 0x4000_0000;

/// The default of `--worker-nice`: the packet workers run 10 nice steps below the rest of
/// vallumd (weight 110 against 1024 under CFS), so a one-rule edit under traffic costs about
/// what it costs idle (BENCHMARKS.md "Drop-in iptables": 5-6x idle with the workers at
/// vallumd's own nice, 0.9-2.1x at 10 steps below, same run).
pub const DEFAULT_WORKER_NICE: i32 = 10;

/// Parses a mark bit: `0x40000000` (hex) or decimal, exactly one bit set.
///
/// Errors: a message naming the value (not a number, zero, or more than one bit).
pub fn parse_mark_bit(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse::<u32>(),
    }
    .map_err(|_| format!("{s:?} is not a 32-bit mark (e.g. 0x40000000)"))?;
    if v.count_ones() != 1 {
        return Err(format!(
            "{s:?}: a mark bit has exactly one bit set (e.g. 0x40000000)"
        ));
    }
    Ok(v)
}

impl FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Source::None),
            "synthetic" => Ok(Source::Synthetic),
            _ if s.starts_with("nfqueue") => s.parse().map(Source::Nfqueue),
            _ => match s.strip_prefix("pcap:") {
                Some(path) if !path.is_empty() => Ok(Source::Pcap(PathBuf::from(path))),
                _ => Err(format!(
                    "unknown packet source {s:?} (none, pcap:FILE, synthetic or \
                     nfqueue[:FIRST][,fail-closed])"
                )),
            },
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::None => f.write_str("none"),
            Source::Pcap(p) => write!(f, "pcap:{}", p.display()),
            Source::Synthetic => f.write_str("synthetic"),
            Source::Nfqueue(q) => {
                write!(f, "nfqueue:{}", q.first)?;
                if q.fail_closed {
                    f.write_str(",fail-closed")?;
                }
                Ok(())
            }
        }
    }
}

/// A `--flag SECONDS` value: a non-negative number, an `s` suffix allowed (`1`, `0.5`, `20s`).
pub(crate) fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|e| format!("{s:?}: {e} (seconds, e.g. 1 or 0.5)"))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?}: must be a non-negative number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Connection-table flags (see the engine's `conntrack` module); flattened into [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct ConntrackArgs {
    /// Most conntrack entries at once (nf_conntrack_max); beyond it an unreplied entry is
    /// evicted, or the new connection's packet dropped. 0 turns connection tracking off
    /// (every packet is NEW to the rules; ConntrackService answers FAILED_PRECONDITION).
    #[arg(long, env = "VALLUM_CONNTRACK_MAX", default_value_t = 262_144)]
    pub conntrack_max: usize,

    /// Initial hash buckets of the connection table (nf_conntrack_buckets), rounded up to a
    /// power of two, 1..=2^30; GC doubles them while the table holds more entries than
    /// buckets, up to `--conntrack-max` rounded up.
    #[arg(long, env = "VALLUM_CONNTRACK_BUCKETS", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub conntrack_buckets: u64,

    /// Seconds between two garbage-collection steps of the connection table; each step
    /// deletes the expired entries of 1/8 of the buckets, so the whole table is swept every
    /// 8 steps. Expired entries also go when a packet or an early drop finds them.
    #[arg(long, env = "VALLUM_CONNTRACK_GC_INTERVAL", default_value = "1", value_parser = parse_positive_seconds)]
    pub conntrack_gc_interval: Duration,

    /// Mid-stream TCP pick-up, as Linux's `nf_conntrack_tcp_loose=1` (its default): a TCP ACK
    /// with no entry (a flow older than the table: after a restart or a flush) opens an
    /// ESTABLISHED entry and is NEW to the rules, so rules that accept the flow's port keep it
    /// alive. `false` (or `0`, `no`, `off`): only a SYN opens an entry, any other TCP packet
    /// without one is INVALID.
    #[arg(long, env = "VALLUM_CONNTRACK_TCP_LOOSE", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub conntrack_tcp_loose: bool,

    /// The connection table is written to the database's path plus `.conntrack` on a graceful
    /// stop and restored at the next start when it was saved at most this many seconds before
    /// (see `conntrack_state`); 0 turns saving and restoring off.
    #[arg(long, env = "VALLUM_CONNTRACK_STATE_MAX_AGE", default_value = "600", value_parser = parse_seconds)]
    pub conntrack_state_max_age: Duration,
}

impl ConntrackArgs {
    /// The engine's table sizes, `None` when `--conntrack-max 0`.
    pub fn engine_config(&self) -> Option<vallum_engine::conntrack::ConntrackConfig> {
        (self.conntrack_max > 0).then(|| vallum_engine::conntrack::ConntrackConfig {
            buckets: usize::try_from(self.conntrack_buckets).unwrap_or(1 << 30),
            max_entries: self.conntrack_max,
            tcp_loose: self.conntrack_tcp_loose,
            ..vallum_engine::conntrack::ConntrackConfig::default()
        })
    }

    /// Buckets one GC step scans: an eighth of the table (at least one).
    pub fn gc_budget(&self) -> usize {
        let buckets = usize::try_from(self.conntrack_buckets.next_power_of_two()).unwrap_or(1);
        (buckets / 8).max(1)
    }
}

/// A duration as `N[s|m|h|d]` (seconds, minutes, hours, days; a bare number is seconds),
/// e.g. `24h`, `90d`, `0.5`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1.0),
        Some((i, 'm')) => (&s[..i], 60.0),
        Some((i, 'h')) => (&s[..i], 3600.0),
        Some((i, 'd')) => (&s[..i], 86_400.0),
        _ => (s, 1.0),
    };
    let n: f64 = number
        .parse()
        .map_err(|e| format!("{s:?}: {e} (a duration: N[s|m|h|d], e.g. 24h or 90d)"))?;
    let secs = n * unit;
    if !secs.is_finite() || !(0.0..=1e12).contains(&secs) {
        return Err(format!("{s:?}: must be a non-negative duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// How long the store keeps idempotency keys and audit records (see
/// [`crate::control::store::Retention`]); flattened into [`Config`]. A periodic task of the store
/// deletes what is past them. 0 turns a bound off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct RetentionArgs {
    /// How long a `request_id` is remembered (N[s|m|h|d]): a retry within it gets the first
    /// call's answer, a call after it runs anew (Stripe keeps keys 24 h). 0: forever.
    #[arg(long, env = "VALLUM_IDEMPOTENCY_TTL", default_value = "24h", value_parser = parse_duration)]
    pub idempotency_ttl: Duration,

    /// Audit records older than this are deleted (N[s|m|h|d]). 0: kept whatever their age.
    #[arg(long, env = "VALLUM_AUDIT_RETENTION", default_value = "90d", value_parser = parse_duration)]
    pub audit_retention: Duration,

    /// At most this many audit records are kept, the newest. 0: no bound.
    #[arg(long, env = "VALLUM_AUDIT_MAX_ROWS", default_value_t = 1_000_000)]
    pub audit_max_rows: u64,
}

impl RetentionArgs {
    /// The store's retention.
    pub fn retention(&self) -> crate::control::store::Retention {
        let bound = |d: Duration| (!d.is_zero()).then_some(d);
        crate::control::store::Retention {
            idempotency_ttl: bound(self.idempotency_ttl),
            audit_max_age: bound(self.audit_retention),
            audit_max_rows: (self.audit_max_rows > 0).then_some(self.audit_max_rows),
        }
    }
}

fn parse_positive_seconds(s: &str) -> Result<Duration, String> {
    let d = parse_seconds(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: must be more than 0 seconds"));
    }
    Ok(d)
}

fn default_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `vallumd` flags. Defaults follow DESIGN.md.
#[derive(Clone, Debug, Parser)]
#[command(name = "vallumd", version, about = "Vallum firewall-management daemon")]
pub struct Config {
    /// gRPC listen address; port 0 picks a free port (printed as `listening on ADDR`).
    #[arg(long, env = "VALLUM_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// The local unix socket (vallumctl's default endpoint), authorized by peer credentials
    /// (root, CAP_NET_ADMIN or `--socket-group` may change state, other local users read;
    /// see `auth`). Default: /run/vallum/vallumd.sock as root, else
    /// $XDG_RUNTIME_DIR/vallum/vallumd.sock; `none` turns it off (see `local_socket`).
    #[arg(long, env = "VALLUM_SOCKET", value_name = "PATH|none")]
    pub socket: Option<PathBuf>,

    /// SQLite database file, created with its parent directory when missing.
    #[arg(long, env = "VALLUM_DB", default_value = "./vallum.db")]
    pub db: PathBuf,

    /// How durable a change is when vallumd answers it: `full`, on disk (the WAL fsynced;
    /// concurrent callers share one fsync), or `normal`, written to the OS (survives a crash
    /// of vallumd, not a power loss). An Apply or EditRuleset may ask for its own
    /// (`durability`; vallum-iptables asks for `normal`). See docs/operations.md "Durability".
    #[arg(long, env = "VALLUM_SYNC", value_enum, default_value = "full")]
    pub sync: crate::control::store::Durability,

    /// Number of engine worker cores (default: available parallelism).
    #[arg(long, env = "VALLUM_CORES", default_value_t = default_cores())]
    pub cores: usize,

    /// Barrier strategy of the packet path.
    #[arg(long, env = "VALLUM_BARRIER", value_enum, default_value = "seqcst")]
    pub barrier: Barrier,

    /// Packet source: none, `pcap:FILE` (replayed in a loop), synthetic, or
    /// `nfqueue[:FIRST][,fail-closed]` (Linux; worker k binds NFQUEUE FIRST+k; see
    /// docs/operations.md).
    #[arg(long, env = "VALLUM_SOURCE", default_value = "none")]
    pub source: Source,

    /// With `--source nfqueue`: the filter chains `vallumctl dataplane install --chains`
    /// steers (comma-separated INPUT, FORWARD, OUTPUT; the installer's default is all
    /// three). Rules reached only from other hooks get a validation warning (see `steering`).
    #[arg(
        long,
        env = "VALLUM_STEERED_CHAINS",
        value_delimiter = ',',
        default_value = "INPUT,FORWARD,OUTPUT",
        value_parser = crate::host::steering::parse_steered_chain
    )]
    pub steered_chains: Vec<vallum_engine::model::Hook>,

    /// With `--source nfqueue`: what our ACCEPT does with the kernel's own rules after the
    /// steering jump (ufw, DOCKER-USER, kube-proxy). `final`: NF_ACCEPT, they are skipped for
    /// packets we accept; `continue`: NF_REPEAT with `--nfqueue-mark` set, so they still
    /// decide (needs `vallumctl dataplane install --mode continue` with the same mark). Our
    /// DROP drops in both. See [`NfqueueAccept`] and docs/operations.md.
    #[arg(long, env = "VALLUM_NFQUEUE_MODE", value_enum, default_value = "final")]
    pub nfqueue_mode: NfqueueMode,

    /// The mark bit `--nfqueue-mode continue` sets on accepted packets (hex or decimal,
    /// exactly one bit); the rest of the packet's mark is kept.
    #[arg(long, env = "VALLUM_NFQUEUE_MARK", default_value = "0x40000000", value_parser = parse_mark_bit)]
    pub nfqueue_mark: u32,

    /// With `--source nfqueue`: the mark field (4 contiguous bits, or 0) that carries a REJECT
    /// verdict to the kernel's REJECT rules of the steering chain (`vallumctl dataplane install
    /// --reject-mark`, same value), which send the ICMP error or TCP RST; with 0, REJECT drops
    /// silently. Reserve these bits: a packet that reaches the steering with one of the codes
    /// set is rejected by the kernel. See [`NfqueueAnswers`] and docs/operations.md.
    #[arg(long, env = "VALLUM_NFQUEUE_REJECT_MARK", default_value = "0x0f000000", value_parser = parse_reject_mark)]
    pub nfqueue_reject_mark: u32,

    /// With `--source nfqueue`: the mark field (contiguous bits, or 0 for none) in which the
    /// steering hands vallumd what the kernel decides for it: `-m policy`, and `-m conntrack`
    /// with `--ctstatus`, `--ctexpire`, `--ctstate DNAT/SNAT` or `--ctorig*`/`--ctrepl*`, one bit
    /// per distinct expression over the active rulesets (more are refused at the rule). vallumd
    /// writes the expressions into the kernel's `VALLUM-FACTS-<HOOK>` chains, which
    /// `vallumctl dataplane install --facts-mark` (same value) creates and jumps to. With 0
    /// `-m policy` and `--ctstatus` are refused and the tuples are vallumd's own tracker's. See
    /// docs/operations.md.
    #[arg(long, env = "VALLUM_NFQUEUE_FACTS_MARK", default_value = "0", value_parser = parse_facts_mark)]
    pub nfqueue_facts_mark: u32,

    /// With `--source nfqueue`: the steering queues only packets the kernel's conntrack does
    /// not see as ESTABLISHED or RELATED (`vallumctl dataplane install --new-only`); the rest
    /// is accepted in the kernel and never reaches vallumd. Rules that can match only such
    /// packets get a validation warning. See docs/operations.md, "Queueing only new
    /// connections".
    #[arg(long, env = "VALLUM_STEERED_NEW_ONLY")]
    pub steered_new_only: bool,

    /// With `--source nfqueue`: the steering queues loopback packets too (`vallumctl dataplane
    /// install --include-loopback`). Without it vallumd takes the installer's default, `lo`
    /// exempt, and rules that can match only loopback packets (`-i lo`, `-o lo`, 127.0.0.0/8,
    /// `::1`) get a validation warning at the rule.
    #[arg(long, env = "VALLUM_STEERED_LOOPBACK")]
    pub steered_loopback: bool,

    /// With `--source nfqueue`: packets each queue holds before the kernel drops new ones (or,
    /// fail-open, accepts them unclassified) (`NFQA_CFG_QUEUE_MAXLEN`). Default: more than the
    /// socket's receive buffer can hold, so the buffer fills first and every fail-open bypass
    /// is counted (`vallum_nfqueue_bypassed_total`); a smaller value with fail-open makes that
    /// count a lower bound (vallumd warns).
    #[arg(long, env = "VALLUM_QUEUE_MAXLEN", value_parser = clap::value_parser!(u32).range(1..))]
    pub queue_maxlen: Option<u32>,

    /// How many nice steps the packet workers' threads run below the rest of vallumd (0..=19;
    /// 0: at vallumd's own; the workers' nice is vallumd's plus this, at most 19): the control
    /// plane (API calls, commits) then runs first on a core the workers keep busy; with
    /// nothing else to run the workers still get every core. Default 10 (a one-rule edit under
    /// traffic costs about its idle cost, not 5x). See docs/operations.md "Control plane under
    /// traffic".
    #[arg(long, env = "VALLUM_WORKER_NICE", default_value_t = DEFAULT_WORKER_NICE,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    pub worker_nice: i32,

    /// Test only, hidden: with `--source nfqueue`, microseconds each worker sleeps after each
    /// batch (about 32 packets per pause), so a test overloads a queue with a modest flood.
    /// Default 0: no pause.
    #[arg(
        long,
        env = "VALLUM_TEST_NFQUEUE_BATCH_DELAY_US",
        default_value_t = 0,
        hide = true
    )]
    pub test_nfqueue_batch_delay_us: u64,

    /// Packets per second over all workers; 0 means as fast as possible.
    #[arg(long, env = "VALLUM_RATE", default_value_t = 0)]
    pub rate: u64,

    /// Load the bundled example ruleset (`host-firewall`) on start when the store has no
    /// ruleset yet.
    #[arg(long, env = "VALLUM_EXAMPLE")]
    pub example: bool,

    /// Metrics: `--metrics-listen` (port 0 picks a free port, printed as `metrics on ADDR`),
    /// `--metrics-rule-counters`, `--otlp-endpoint`.
    #[command(flatten)]
    pub metrics: MetricsConfig,

    /// Bearer tokens: `--token-file`, `--admin-token-file`, `--reader-token-file`,
    /// `--insecure-no-auth`.
    #[command(flatten)]
    pub auth: AuthConfig,

    /// TLS / mTLS: `--tls-cert`, `--tls-key`, `--tls-client-ca`.
    #[command(flatten)]
    pub tls: ServerTlsArgs,

    /// Limits: `--max-request-bytes`, `--max-rules`, `--max-chains`, `--max-rulesets`,
    /// `--max-revisions-kept`.
    #[command(flatten)]
    pub limits: LimitsConfig,

    /// gRPC connections: `--max-connections`, `--max-connections-per-peer`,
    /// `--handshake-timeout`, `--idle-timeout`, `--keepalive-interval`, `--keepalive-timeout`,
    /// `--max-buffered-request-bytes` (see `connections`).
    #[command(flatten)]
    pub connections: crate::grpc::connections::ConnectionsConfig,

    /// Conntrack: `--conntrack-max`, `--conntrack-buckets`, `--conntrack-gc-interval`.
    #[command(flatten)]
    pub conntrack: ConntrackArgs,

    /// Store retention: `--idempotency-ttl`, `--audit-retention`, `--audit-max-rows`.
    #[command(flatten)]
    pub retention: RetentionArgs,

    /// What to do when a stored active revision does not load at start: `refuse` (exit,
    /// the default) or `degraded` (serve the others; the failed ruleset is NOT_SERVING
    /// under the health name `rulesets/NAME`). Either way the revision is marked in the
    /// store and an audit record written.
    #[arg(
        long,
        env = "VALLUM_ON_LOAD_FAILURE",
        value_enum,
        default_value = "refuse"
    )]
    pub on_load_failure: OnLoadFailure,

    /// The node's addresses for `-m addrtype`, as `[broadcast:]ADDR[/LEN][@DEV],...` (the
    /// local routing table's local and broadcast routes); without it vallumd reads the host's
    /// local table over rtnetlink and refreshes it every `--local-addresses-refresh` (see
    /// `local_addrs`). Meant for the pcap and synthetic sources and for tests.
    #[arg(long, env = "VALLUM_LOCAL_ADDRESSES")]
    pub local_addresses: Option<crate::host::local_addrs::LocalAddresses>,

    /// The node's routes for `-m rpfilter`, as `[TYPE:]PREFIX[@DEV[+DEV...]],...` under the
    /// kernel's default rules (see `routes`); without it vallumd reads the host's rules and
    /// routes over rtnetlink with its addresses (host mode), or has none when
    /// `--local-addresses` is given (rpfilter rules are then refused).
    #[arg(long, env = "VALLUM_ROUTES")]
    pub routes: Option<crate::host::routes::Routes>,

    /// How often the host's addresses are read again (seconds; host mode only).
    #[arg(long, env = "VALLUM_LOCAL_ADDRESSES_REFRESH", default_value = "1", value_parser = parse_seconds)]
    pub local_addresses_refresh: Duration,

    /// Kernel tables: `--kernel-tables nat,mangle` hands those tables (stored, not enforced
    /// by vallumd) to the kernel with each commit, `--kernel-tables-restore`,
    /// `--kernel-tables-check-interval` (see `kernel_tables`).
    #[command(flatten)]
    pub kernel_tables: crate::host::kernel_tables::KernelTablesArgs,

    /// Fleet mode: `--fleet-endpoints`, `--node-name`, `--node-labels`, `--fleet-prefix`,
    /// `--fleet-lease-ttl` (off without `--fleet-endpoints`).
    #[command(flatten)]
    pub fleet: crate::control::fleet::FleetArgs,

    /// How often pending commit-confirmed deadlines and a running shadow's end are checked, in
    /// seconds.
    #[arg(long, env = "VALLUM_CONFIRM_CHECK_INTERVAL", default_value = "1", value_parser = parse_seconds)]
    pub confirm_check_interval: Duration,

    /// Run this many seconds, print a summary and exit 0 (for the Quick start in CI).
    #[arg(long, env = "VALLUM_EXIT_AFTER", value_parser = parse_seconds)]
    pub exit_after: Option<Duration>,

    /// Test seam: wait this long (seconds) before loading the stored state, so health stays
    /// NOT_SERVING observably.
    #[arg(long, env = "VALLUM_LOAD_DELAY", value_parser = parse_seconds, hide = true)]
    pub load_delay: Option<Duration>,
}

impl Config {
    /// What our NFQUEUE ACCEPT means (`--nfqueue-mode`, `--nfqueue-mark`).
    pub fn nfqueue_accept(&self) -> NfqueueAccept {
        match self.nfqueue_mode {
            NfqueueMode::Final => NfqueueAccept::Final,
            NfqueueMode::Continue => NfqueueAccept::Continue {
                mark: self.nfqueue_mark,
            },
        }
    }

    /// How queued packets are answered (`--nfqueue-mode`, `--nfqueue-mark`,
    /// `--nfqueue-reject-mark`).
    pub fn nfqueue_answers(&self) -> NfqueueAnswers {
        NfqueueAnswers {
            accept: self.nfqueue_accept(),
            reject_mark: self.nfqueue_reject_mark,
            facts_mark: self.nfqueue_facts_mark,
        }
    }

    /// The packet source with the flags that refine it (`--queue-maxlen` and
    /// `--test-nfqueue-batch-delay-us` for NFQUEUE).
    pub fn packet_source(&self) -> Source {
        match &self.source {
            Source::Nfqueue(q) => Source::Nfqueue(NfqueueSource {
                maxlen: self.queue_maxlen,
                batch_delay: (self.test_nfqueue_batch_delay_us > 0)
                    .then(|| Duration::from_micros(self.test_nfqueue_batch_delay_us)),
                ..*q
            }),
            s => s.clone(),
        }
    }

    /// Parses flags from `args` (first item is the program name) WITHOUT reading the
    /// environment: for tests and embedding.
    ///
    /// Errors: clap's error for unknown flags or bad values.
    pub fn from_args<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        // `env` attributes are read by clap at parse time; disable them by parsing with
        // a command whose args have env lookups removed.
        let cmd = <Config as clap::CommandFactory>::command();
        let cmd = cmd.mut_args(|a| a.env(None::<&str>));
        let matches = cmd.try_get_matches_from(args)?;
        <Config as clap::FromArgMatches>::from_arg_matches(&matches)
    }
}

impl Default for Config {
    /// The defaults of every flag, without reading the environment.
    fn default() -> Self {
        Config::from_args(["vallumd"]).unwrap_or_else(|e| unreachable!("defaults parse: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_sources() {
        let c = Config::from_args(["vallumd"]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(c.db, PathBuf::from("./vallum.db"));
        assert_eq!(c.source, Source::None);
        assert!(c.cores >= 1);
        assert_eq!(c.on_load_failure, OnLoadFailure::Refuse, "the safe default");
        let c = Config::from_args(["vallumd", "--on-load-failure", "degraded"]).unwrap();
        assert_eq!(c.on_load_failure, OnLoadFailure::Degraded);
        let c =
            Config::from_args(["vallumd", "--source", "pcap:/tmp/x.pcap", "--rate", "5"]).unwrap();
        assert_eq!(c.source, Source::Pcap("/tmp/x.pcap".into()));
        assert_eq!(c.rate, 5);
        assert!(Config::from_args(["vallumd", "--source", "bogus"]).is_err());
        for (text, first, fail_closed, shown) in [
            ("nfqueue", 0, false, "nfqueue:0"),
            ("nfqueue:4", 4, false, "nfqueue:4"),
            ("nfqueue,fail-closed", 0, true, "nfqueue:0,fail-closed"),
            (
                "nfqueue:65535,fail-closed",
                65535,
                true,
                "nfqueue:65535,fail-closed",
            ),
        ] {
            let c = Config::from_args(["vallumd", "--source", text]).unwrap();
            let want = Source::Nfqueue(NfqueueSource {
                first,
                fail_closed,
                maxlen: None,
                batch_delay: None,
            });
            assert_eq!(c.source, want, "{text}");
            assert_eq!(c.source.to_string(), shown);
            assert_eq!(shown.parse::<Source>(), Ok(want));
        }
        for bad in [
            "nfqueue:",
            "nfqueue:x",
            "nfqueue:65536",
            "nfqueue4",
            "nfqueue,open",
        ] {
            assert!(bad.parse::<Source>().is_err(), "{bad}");
        }
        let c = Config::from_args(["vallumd", "--exit-after", "1.5"]).unwrap();
        assert_eq!(c.exit_after, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn nfqueue_modes() {
        let c = Config::from_args(["vallumd"]).unwrap();
        assert_eq!(
            c.nfqueue_accept(),
            NfqueueAccept::Final,
            "today's behaviour"
        );
        assert_eq!(c.nfqueue_mark, DEFAULT_CONTINUE_MARK);
        let c = Config::from_args(["vallumd", "--nfqueue-mode", "continue"]).unwrap();
        assert_eq!(
            c.nfqueue_accept(),
            NfqueueAccept::Continue { mark: 0x4000_0000 }
        );
        let c = Config::from_args([
            "vallumd",
            "--nfqueue-mode",
            "continue",
            "--nfqueue-mark",
            "256",
        ])
        .unwrap();
        assert_eq!(c.nfqueue_accept(), NfqueueAccept::Continue { mark: 0x100 });
        assert_eq!(parse_mark_bit("0x80000000"), Ok(0x8000_0000));
        for bad in ["0", "0x3", "x", "0x100000000", "-1"] {
            assert!(parse_mark_bit(bad).is_err(), "{bad}");
            assert!(Config::from_args(["vallumd", "--nfqueue-mark", bad]).is_err());
        }
        assert!(Config::from_args(["vallumd", "--nfqueue-mode", "maybe"]).is_err());
    }

    #[test]
    fn facts_marks() {
        for (ok, v) in [
            ("0", 0),
            ("0x00ff0000", 0x00ff_0000),
            ("0x80000000", 1 << 31),
        ] {
            assert_eq!(parse_facts_mark(ok), Ok(v), "{ok}");
        }
        for bad in ["0x00ff00ff", "0x5", "x", "0x1ffffffff"] {
            assert!(parse_facts_mark(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reject_marks() {
        let c = Config::from_args(["vallumd"]).unwrap();
        assert_eq!(c.nfqueue_answers().reject_mark, DEFAULT_REJECT_MARK);
        for (ok, v) in [
            ("0", 0),
            ("0xf0", 0xf0),
            ("0xF0000000", 0xf000_0000),
            ("15", 15),
        ] {
            assert_eq!(parse_reject_mark(ok), Ok(v), "{ok}");
        }
        for bad in ["0x0f0f", "0x7", "0x1f", "x", "-1", "0x100000000"] {
            assert!(parse_reject_mark(bad).is_err(), "{bad}");
            assert!(Config::from_args(["vallumd", "--nfqueue-reject-mark", bad]).is_err());
        }
    }

    #[test]
    fn conntrack_flags() {
        let c = Config::from_args(["vallumd"]).unwrap().conntrack;
        let e = c.engine_config().unwrap();
        assert_eq!((e.max_entries, e.buckets), (262_144, 65_536));
        assert_eq!(c.conntrack_gc_interval, Duration::from_secs(1));
        assert_eq!(c.gc_budget(), 8192);
        assert!(e.tcp_loose, "pick-up on by default, as Linux");
        for (v, loose) in [
            ("false", false),
            ("0", false),
            ("off", false),
            ("true", true),
        ] {
            let c = Config::from_args(["vallumd", "--conntrack-tcp-loose", v]).unwrap();
            assert_eq!(c.conntrack.engine_config().unwrap().tcp_loose, loose, "{v}");
        }
        assert!(Config::from_args(["vallumd", "--conntrack-tcp-loose", "maybe"]).is_err());
        let c = Config::from_args([
            "vallumd",
            "--conntrack-max",
            "100",
            "--conntrack-buckets",
            "10",
            "--conntrack-gc-interval",
            "0.25",
        ])
        .unwrap()
        .conntrack;
        let e = c.engine_config().unwrap();
        assert_eq!((e.max_entries, e.buckets), (100, 10));
        assert_eq!(c.gc_budget(), 2);
        assert_eq!(c.conntrack_gc_interval, Duration::from_millis(250));
        let off = Config::from_args(["vallumd", "--conntrack-max", "0"]).unwrap();
        assert_eq!(off.conntrack.engine_config(), None);
        for bad in [
            ["--conntrack-buckets", "0"],
            ["--conntrack-buckets", "2000000000"],
            ["--conntrack-gc-interval", "0"],
            ["--conntrack-max", "-1"],
        ] {
            assert!(
                Config::from_args(["vallumd", bad[0], bad[1]]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn retention_flags() {
        let c = Config::from_args(["vallumd"]).unwrap().retention;
        assert_eq!(c.retention(), crate::control::store::Retention::default());
        assert_eq!(c.idempotency_ttl, Duration::from_secs(24 * 3600));
        let c = Config::from_args([
            "vallumd",
            "--idempotency-ttl",
            "90m",
            "--audit-retention",
            "0",
            "--audit-max-rows",
            "10",
        ])
        .unwrap()
        .retention;
        let r = c.retention();
        assert_eq!(r.idempotency_ttl, Some(Duration::from_secs(5400)));
        assert_eq!((r.audit_max_age, r.audit_max_rows), (None, Some(10)));
        for (text, secs) in [
            ("30", 30.0),
            ("1.5s", 1.5),
            ("2d", 172_800.0),
            ("1h", 3600.0),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs_f64(secs)),
                "{text}"
            );
        }
        for bad in ["", "h", "-1h", "1w", "1e300d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ops_flags() {
        let c = Config::from_args(["vallumd"]).unwrap();
        assert_eq!(c.metrics.metrics_listen.to_string(), "127.0.0.1:9464");
        assert!(c.auth.token_file.is_none() && c.tls.tls_cert.is_none());
        assert_eq!(c.limits.max_rules_per_ruleset, 100_000);
        assert_eq!(c.limits.max_chains_per_ruleset, 65_536);
        let c = Config::from_args([
            "vallumd",
            "--metrics-listen",
            "127.0.0.1:0",
            "--token-file",
            "/t",
            "--tls-cert",
            "/c",
            "--tls-key",
            "/k",
            "--max-rules",
            "5",
            "--max-rulesets",
            "6",
            "--max-revisions-kept",
            "7",
            "--max-request-bytes",
            "8",
            "--max-chains",
            "9",
        ])
        .unwrap();
        assert_eq!(c.metrics.metrics_listen.port(), 0);
        assert_eq!(c.auth.token_file, Some(PathBuf::from("/t")));
        assert_eq!(c.tls.tls_key, Some(PathBuf::from("/k")));
        assert_eq!(
            (
                c.limits.max_rules_per_ruleset,
                c.limits.max_rulesets,
                c.limits.max_revisions_kept,
                c.limits.max_request_bytes,
                c.limits.max_chains_per_ruleset
            ),
            (5, 6, 7, 8, 9)
        );
    }
}
