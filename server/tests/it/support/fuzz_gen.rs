//! Generators of the gRPC request fuzzer (`tests/it/grpc_fuzz.rs`): a seeded splitmix64 generator
//! and grammar-aware producers of iptables-restore text, `ipset save` text, structured rulesets,
//! names, packet specs, Ethernet/IP frames and pcap/pcapng captures, each with mutations
//! (truncation, byte flips, duplicated and dropped lines, huge numbers, NUL and non-ASCII).
//!
//! Every choice comes from [`Rng`], never from a server answer, so a seed replays the same
//! request sequence. Sizes that today's vallumd cannot take in time are capped by [`Caps`].
#![allow(dead_code)] // Each test uses a different part.

use vallum_proto::v1 as pb;

/// splitmix64: small, deterministic, enough to spread requests.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next() % n as u64) as usize
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille`/1000.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < per_mille as usize
    }

    /// One item of `items` (non-empty).
    pub fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }

    /// A size skewed towards small values: `0..=max`, most often below 8.
    pub fn small(&mut self, max: usize) -> usize {
        match self.below(10) {
            0..=6 => self.below(max.min(8) + 1),
            7 | 8 => self.below(max.min(64) + 1),
            _ => self.below(max + 1),
        }
    }
}

/// Size caps of the generators (env `VALLUM_FUZZ_DEEP_MAX`, `VALLUM_FUZZ_CHAINS_MAX`).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Longest chain of jumps (`C0 -> C1 -> ...`) in one ruleset.
    pub deep_max: usize,
    /// Most chains in one flat ruleset.
    pub chains_max: usize,
    /// Most bytes of a request that is meant to fit `--max-request-bytes`.
    pub request_bytes: usize,
}

// === names ===

/// Ruleset names the fuzzer reuses, so that requests meet existing state.
pub const RULESETS: &[&str] = &["fz0", "fz1", "fz2", "web-1.a_b"];
/// Set names the fuzzer reuses.
pub const SETS: &[&str] = &["s0", "s1", "s2", "blk"];

/// A weird name: empty, dots, slashes, dashes, long, unicode, NUL, spaces, newlines.
pub fn weird_name(r: &mut Rng) -> String {
    match r.below(16) {
        0 => String::new(),
        1 => ".".into(),
        2 => "..".into(),
        3 => "-x".into(),
        4 => "a/b".into(),
        5 => "x".repeat([63, 64, 300, 10_000][r.below(4)]),
        6 => "règles-名前".into(),
        7 => "a\0b".into(),
        8 => "a b".into(),
        9 => "a\nb".into(),
        10 => "rulesets/".into(),
        11 => "%2e%2e".into(),
        12 => "\u{1F525}".into(),
        13 => "x".repeat(r.range(1, 70)),
        14 => "\u{202e}abc".into(),
        _ => random_text(r, 20),
    }
}

/// A ruleset name: mostly from [`RULESETS`], sometimes weird, sometimes prefixed `rulesets/`.
pub fn ruleset_name(r: &mut Rng) -> String {
    match r.below(20) {
        0..=13 => r.pick(RULESETS).to_string(),
        14 | 15 => format!("rulesets/{}", r.pick(RULESETS)),
        16 => format!("fz{}", r.below(40)),
        _ => weird_name(r),
    }
}

/// The type the fuzzer creates each of [`SETS`] with.
pub fn set_type(name: &str) -> &'static str {
    match name {
        "s0" => "hash:ip",
        "s1" => "hash:net",
        "s2" => "hash:ip,port",
        "blk" => "hash:net,port",
        _ => "hash:ip",
    }
}

/// A set name: mostly from [`SETS`], sometimes weird.
pub fn set_name(r: &mut Rng) -> String {
    match r.below(20) {
        0..=15 => r.pick(SETS).to_string(),
        16 => format!("s{}", r.below(40)),
        _ => weird_name(r),
    }
}

/// A revision name: `rulesets/{r}/revisions/{n}` with small, zero, huge or broken numbers.
pub fn revision_name(r: &mut Rng) -> String {
    let rs = if r.chance(900) {
        r.pick(RULESETS).to_string()
    } else {
        weird_name(r)
    };
    let n = match r.below(12) {
        0..=7 => r.range(1, 10).to_string(),
        8 => "0".into(),
        9 => r
            .pick(&[
                "18446744073709551615",
                "18446744073709551616",
                "-1",
                "1e3",
                "",
                " 1",
                "+1",
            ])
            .to_string(),
        10 => r.below(100_000).to_string(),
        _ => weird_name(r),
    };
    match r.below(20) {
        0 => format!("rulesets/{rs}/revisions/"),
        1 => format!("rulesets/{rs}"),
        2 => format!("{rs}/revisions/{n}"),
        3 => weird_name(r),
        4 => format!("rulesets/{rs}/revisions/{n}/revisions/{n}"),
        _ => format!("rulesets/{rs}/revisions/{n}"),
    }
}

/// Printable ASCII with a few non-ASCII, control and quote characters.
pub fn random_text(r: &mut Rng, max: usize) -> String {
    let n = r.small(max);
    let mut s = String::with_capacity(n);
    for _ in 0..n {
        let c = match r.below(30) {
            0 => '\0',
            1 => '\n',
            2 => '"',
            3 => '\\',
            4 => 'é',
            5 => '\u{FFFD}',
            6 => '\t',
            7 => '!',
            _ => char::from(b' ' + r.below(95) as u8),
        };
        s.push(c);
    }
    s
}

// === iptables-restore text ===

const V4_ADDRS: &[&str] = &[
    "10.0.0.0/8",
    "192.0.2.1",
    "198.51.100.0/24",
    "0.0.0.0/0",
    "10.1.2.3/255.0.255.0",
    "127.0.0.1/32",
    "1.2.3.4/33",
    "256.1.1.1",
    "10.0.0.0/0.0.0.255",
    "host.invalid",
];
const V6_ADDRS: &[&str] = &[
    "2001:db8::/32",
    "::1",
    "::/0",
    "fe80::1/64",
    "2001:db8::/ffff:ffff::",
    "2001:db8::/129",
    "::ffff:10.0.0.1",
    "2001:db8:::1",
];
const IFACES: &[&str] = &[
    "lo",
    "eth0",
    "eth+",
    "br-1",
    "+",
    "veth12345678901",
    "a!b",
    "veth1234567890123",
];
const PORTS: &[&str] = &[
    "22",
    "80",
    "1:1023",
    "8000:8100",
    "0",
    "65535",
    "65536",
    ":80",
    "80:",
    "ssh",
    "http",
    "99999999999",
    "5:3",
];
const STATES: &[&str] = &[
    "NEW",
    "ESTABLISHED",
    "RELATED",
    "INVALID",
    "UNTRACKED",
    "RELATED,ESTABLISHED",
    "NEW,INVALID",
    "SNAT,DNAT",
    "BOGUS",
    "",
];
const ICMP_TYPES: &[&str] = &[
    "echo-request",
    "echo-reply",
    "8",
    "8/0",
    "3/4",
    "any",
    "255/255",
    "256",
    "destination-unreachable",
    "timestamp-request",
];
const ICMP6_TYPES: &[&str] = &[
    "neighbour-solicitation",
    "echo-request",
    "128",
    "1/3",
    "router-advertisement",
    "300",
];
const PROTOS: &[&str] = &[
    "tcp",
    "udp",
    "icmp",
    "47",
    "all",
    "sctp",
    "udplite",
    "0",
    "255",
    "256",
    "ipv6-icmp",
    "esp",
    "nosuchproto",
];

/// Table and its builtin chains.
const TABLES: &[(&str, &[&str])] = &[
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("raw", &["PREROUTING", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    (
        "mangle",
        &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    ),
    ("security", &["INPUT", "FORWARD", "OUTPUT"]),
];

fn neg(r: &mut Rng) -> &'static str {
    if r.chance(150) { "! " } else { "" }
}

fn addr(r: &mut Rng, v6: bool) -> &'static str {
    if v6 {
        r.pick(V6_ADDRS)
    } else {
        r.pick(V4_ADDRS)
    }
}

/// One `-m NAME ...` match (or a bare option), suited to `proto` most of the time.
fn a_match(r: &mut Rng, proto: &str, v6: bool) -> String {
    let n = neg(r);
    match r.below(17) {
        0 => format!("-m tcp {n}--dport {}", r.pick(PORTS)),
        1 => format!("-m udp {n}--sport {}", r.pick(PORTS)),
        2 => format!(
            "-m tcp --tcp-flags {} {}",
            r.pick(&["SYN,ACK,FIN,RST", "ALL", "NONE", "SYN", "BOGUS"]),
            r.pick(&["SYN", "NONE", "ACK,FIN", "ALL"])
        ),
        3 => format!("-m tcp {n}--syn"),
        4 => format!(
            "-m multiport {n}--{} {}",
            r.pick(&["dports", "sports", "ports"]),
            (0..r.range(1, 17))
                .map(|_| r.pick(PORTS))
                .collect::<Vec<_>>()
                .join(",")
        ),
        5 => format!("-m conntrack {n}--ctstate {}", r.pick(STATES)),
        6 => format!("-m state {n}--state {}", r.pick(STATES)),
        7 => {
            let (a, b) = if v6 {
                ("2001:db8::1", "2001:db8::9")
            } else {
                ("192.0.2.1", "192.0.2.9")
            };
            format!(
                "-m iprange {n}--{} {a}-{b}",
                r.pick(&["src-range", "dst-range"])
            )
        }
        8 => format!(
            "-m set {n}--match-set {} {}",
            set_name_token(r),
            r.pick(&["src", "dst", "src,dst", "dst,dst,src", "bogus"])
        ),
        9 => format!("-m comment --comment {}", quoted(r)),
        10 => format!(
            "-m mark {n}--mark {}",
            r.pick(&["0x10/0xf0", "1", "0xffffffff", "0x100000000", "-1"])
        ),
        11 => format!(
            "-m length {n}--length {}",
            r.pick(&["1000:", "0:65535", "64", "70000", "5:1"])
        ),
        12 => format!(
            "-m limit --limit {} --limit-burst {}",
            r.pick(&[
                "60/minute",
                "5/sec",
                "1/hour",
                "10/day",
                "0/sec",
                "99999999/sec",
                "x"
            ]),
            r.pick(&["1", "10", "0", "10001", "4294967296"])
        ),
        13 => format!(
            "-m mac {n}--mac-source {}",
            r.pick(&["02:00:00:AA:bb:01", "zz:00:00:00:00:00", "02:00"])
        ),
        14 => {
            if v6 {
                format!("-m icmp6 {n}--icmpv6-type {}", r.pick(ICMP6_TYPES))
            } else {
                format!("-m icmp {n}--icmp-type {}", r.pick(ICMP_TYPES))
            }
        }
        15 => match proto {
            "tcp" | "udp" => format!("{n}--dport {}", r.pick(PORTS)),
            _ => format!(
                "-m {}",
                r.pick(&[
                    "addrtype --dst-type LOCAL",
                    "nosuchmatch",
                    "tcp --bogus",
                    "owner --uid-owner 0"
                ])
            ),
        },
        _ => format!(
            "-m conntrack --ctstatus ASSURED --ctproto tcp --ctdir {}",
            r.pick(&["ORIGINAL", "REPLY", "X"])
        ),
    }
}

fn set_name_token(r: &mut Rng) -> String {
    if r.chance(900) {
        r.pick(SETS).to_string()
    } else {
        r.pick(&[
            "nosuchset",
            "-x",
            "\"a b\"",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        ])
        .to_string()
    }
}

fn quoted(r: &mut Rng) -> String {
    match r.below(6) {
        0 => "\"\"".into(),
        1 => "\"say \\\"hi\\\"\"".into(),
        2 => "\"unterminated".into(),
        3 => format!("\"{}\"", "c".repeat(r.range(200, 300))),
        _ => format!(
            "\"{}\"",
            random_text(r, 20).replace(['"', '\\', '\n', '\0'], "_")
        ),
    }
}

/// A target for a rule of `table`, jumping to one of `chains` sometimes.
fn a_target(r: &mut Rng, table: &str, chains: &[String], v6: bool) -> String {
    let jg = if r.chance(100) { "-g" } else { "-j" };
    if !chains.is_empty() && r.chance(250) {
        return format!("{jg} {}", chains[r.below(chains.len())]);
    }
    let t = match (table, r.below(10)) {
        (_, 0) => "ACCEPT".into(),
        (_, 1) => "DROP".into(),
        (_, 2) => "RETURN".into(),
        (_, 3) => format!(
            "LOG --log-prefix {} --log-level {}",
            quoted(r),
            r.pick(&["alert", "4", "9", "debug"])
        ),
        (_, 4) => "NOSUCHCHAIN".into(),
        ("filter", 5) => format!(
            "REJECT --reject-with {}",
            if v6 {
                r.pick(&["icmp6-adm-prohibited", "tcp-reset", "icmp-host-prohibited"])
            } else {
                r.pick(&[
                    "icmp-host-prohibited",
                    "tcp-reset",
                    "icmp-port-unreachable",
                    "bogus",
                ])
            }
        ),
        ("raw", 5) => r
            .pick(&["NOTRACK", "CT --notrack", "CT --zone 7 --ctevents mark,new"])
            .into(),
        ("nat", 5) => r
            .pick(&[
                "DNAT --to-destination 198.51.100.7:80",
                "SNAT --to-source 192.0.2.1",
                "MASQUERADE",
                "REDIRECT --to-ports 8080",
            ])
            .into(),
        ("mangle", 5) => r
            .pick(&[
                "MARK --set-mark 0x1",
                "MARK --set-xmark 0x1/0xff",
                "TOS --set-tos 0x10",
            ])
            .into(),
        (_, 6) => "".into(),
        _ => r.pick(&["ACCEPT", "DROP", "REJECT"]).into(),
    };
    if t.is_empty() { t } else { format!("{jg} {t}") }
}

/// One rule's spec (the part after `-A CHAIN `).
fn rule_spec(r: &mut Rng, table: &str, chains: &[String], v6: bool) -> String {
    let mut parts: Vec<String> = Vec::new();
    if r.chance(300) {
        parts.push(format!("{}-s {}", neg(r), addr(r, v6)));
    }
    if r.chance(200) {
        parts.push(format!("{}-d {}", neg(r), addr(r, v6)));
    }
    if r.chance(150) {
        parts.push(format!("{}-i {}", neg(r), r.pick(IFACES)));
    }
    if r.chance(100) {
        parts.push(format!("{}-o {}", neg(r), r.pick(IFACES)));
    }
    let proto = if r.chance(600) { r.pick(PROTOS) } else { "" };
    if !proto.is_empty() {
        parts.push(format!("{}-p {proto}", neg(r)));
    }
    if !v6 && r.chance(40) {
        parts.push(format!("{}-f", neg(r)));
    }
    for _ in 0..r.small(6) {
        parts.push(a_match(r, proto, v6));
    }
    parts.push(a_target(r, table, chains, v6));
    if r.chance(30) {
        parts.insert(
            0,
            format!(
                "-c {} {}",
                r.below(1000),
                r.pick(&["0", "18446744073709551615", "18446744073709551616", "x"])
            ),
        );
    }
    parts.join(" ")
}

/// A grammar-aware iptables-restore text: 1-3 tables, builtin and user chains, rules, and
/// now and then `-I`, `-D`, `-N`, `-X`, `-F`, `-P`, comments, counters and `-4`/`-6` prefixes.
pub fn restore_text(r: &mut Rng, v6: bool) -> String {
    let mut out = String::new();
    let ntables = r.range(1, 3);
    for _ in 0..ntables {
        let (table, builtins) = if r.chance(700) {
            TABLES[0]
        } else {
            TABLES[r.below(TABLES.len())]
        };
        out.push_str(&format!("*{table}\n"));
        for b in builtins.iter() {
            if r.chance(800) {
                let pol = r.pick(&["ACCEPT", "ACCEPT", "DROP", "-", "REJECT"]);
                out.push_str(&format!(":{b} {pol} [{}:{}]\n", r.below(100), counter(r)));
            }
        }
        let nuser = r.small(12);
        let users: Vec<String> = (0..nuser).map(|i| user_chain(r, i)).collect();
        for u in &users {
            out.push_str(&format!(":{u} - [0:0]\n"));
        }
        let mut all: Vec<String> = builtins.iter().map(|s| s.to_string()).collect();
        all.extend(users.iter().cloned());
        let nrules = r.small(40);
        for _ in 0..nrules {
            let chain = all[r.below(all.len())].clone();
            let fam = match r.below(40) {
                0 => "-4 ",
                1 => "-6 ",
                _ => "",
            };
            let line = match r.below(30) {
                0 => format!(
                    "-I {chain} {} {}",
                    r.pick(&["1", "2", "0", "99", "4294967296"]),
                    rule_spec(r, table, &users, v6)
                ),
                1 => format!("-D {chain} {}", r.pick(&["1", "2", "0", "99"])),
                2 => format!("-D {chain} {}", rule_spec(r, table, &users, v6)),
                3 => format!("-N {}", user_chain(r, 99)),
                4 => format!(
                    "-X {}",
                    if users.is_empty() {
                        "x".into()
                    } else {
                        users[r.below(users.len())].clone()
                    }
                ),
                5 => format!("-F {chain}"),
                6 => format!("-P {chain} {}", r.pick(&["ACCEPT", "DROP", "RETURN"])),
                7 => format!("# {}", random_text(r, 30).replace('\n', " ")),
                8 => String::new(),
                9 => format!("-R {chain} 1 {}", rule_spec(r, table, &users, v6)),
                10 => format!(
                    "[{}:{}] -A {chain} {}",
                    r.below(9),
                    counter(r),
                    rule_spec(r, table, &users, v6)
                ),
                _ => format!("-A {chain} {}", rule_spec(r, table, &users, v6)),
            };
            out.push_str(fam);
            out.push_str(&line);
            out.push('\n');
        }
        if r.chance(970) {
            out.push_str("COMMIT\n");
        }
    }
    out
}

fn counter(r: &mut Rng) -> String {
    match r.below(10) {
        0 => "18446744073709551615".into(),
        1 => "18446744073709551616".into(),
        2 => "-1".into(),
        _ => r.below(100_000).to_string(),
    }
}

fn user_chain(r: &mut Rng, i: usize) -> String {
    match r.below(40) {
        0 => "x".repeat(r.range(28, 40)),
        1 => "INPUT".into(),
        2 => "-bad".into(),
        3 => "ACCEPT".into(),
        4 => "名前".into(),
        _ => format!("u{i}"),
    }
}

/// A valid small filter ruleset (no mutation), so that commits succeed often enough.
pub fn valid_text(r: &mut Rng) -> String {
    let mut s = String::from(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:web - [0:0]\n",
    );
    for _ in 0..r.range(0, 6) {
        let line = match r.below(8) {
            0 => format!(
                "-A INPUT -p tcp -m tcp --dport {} -j web",
                r.range(1, 65535)
            ),
            1 => format!("-A web -s 10.{}.0.0/16 -j ACCEPT", r.below(256)),
            2 => "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into(),
            3 => {
                let set = r.pick(SETS);
                let dirs = if set_type(set).ends_with(",port") {
                    "src,dst"
                } else {
                    "src"
                };
                format!("-A INPUT -m set --match-set {set} {dirs} -j DROP")
            }
            4 => "-A INPUT -p icmp -m icmp --icmp-type echo-request -j ACCEPT".into(),
            5 => format!("-A FORWARD -i eth{} -j DROP", r.below(4)),
            6 => "-A web -j RETURN".into(),
            _ => format!(
                "-A INPUT -p udp -m multiport --dports 53,{} -j ACCEPT",
                r.range(1, 65535)
            ),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str("COMMIT\n");
    s
}

/// `n` chains in one line of jumps (`INPUT -> C0 -> C1 -> ... -> C{n-1}`), optionally closed
/// into a loop (`C{n-1} -> C0`).
pub fn deep_chain(n: usize, looped: bool) -> String {
    let mut s = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..n {
        s.push_str(&format!(":C{i} - [0:0]\n"));
    }
    s.push_str("-A INPUT -j C0\n");
    for i in 0..n.saturating_sub(1) {
        s.push_str(&format!("-A C{i} -j C{}\n", i + 1));
    }
    if looped && n > 0 {
        s.push_str(&format!("-A C{} -j C0\n", n - 1));
    }
    s.push_str("COMMIT\n");
    s
}

/// `n` empty user chains, optionally each jumped to from INPUT.
pub fn flat_chains(n: usize, jumps: bool) -> String {
    let mut s = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..n {
        s.push_str(&format!(":F{i} - [0:0]\n"));
    }
    if jumps {
        for i in 0..n {
            s.push_str(&format!("-A INPUT -j F{i}\n"));
        }
    }
    s.push_str("COMMIT\n");
    s
}

/// Many rules in INPUT (`n` lines).
pub fn many_rules(r: &mut Rng, n: usize) -> String {
    let mut s = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..n {
        s.push_str(&format!(
            "-A INPUT -s 10.{}.{}.0/24 -p tcp -m tcp --dport {} -j {}\n",
            (i >> 8) & 255,
            i & 255,
            1 + r.below(65535),
            if i % 2 == 0 { "ACCEPT" } else { "DROP" }
        ));
    }
    s.push_str("COMMIT\n");
    s
}

/// A text mutated 1-4 times: truncation, byte changes (kept UTF-8), duplicated, dropped,
/// swapped or repeated lines, inserted tokens, NUL and non-ASCII, numbers made huge.
pub fn mutate_text(r: &mut Rng, text: &str, max_bytes: usize) -> String {
    let mut s = text.to_string();
    for _ in 0..r.range(1, 4) {
        if s.is_empty() {
            s.push_str("*filter\n");
        }
        match r.below(11) {
            0 => {
                let at = floor_boundary(&s, r.below(s.len() + 1));
                s.truncate(at);
            }
            1 => {
                let mut b = s.into_bytes();
                for _ in 0..r.range(1, 8) {
                    let i = r.below(b.len());
                    b[i] = match r.below(4) {
                        0 => b[i] ^ (1 << r.below(7)),
                        1 => b' ' + r.below(95) as u8,
                        2 => *r.pick(&[
                            &b'\n', &b' ', &b'"', &b'!', &b'-', &b':', &b'*', &b'\0', &b'\t',
                        ]),
                        _ => b'0' + r.below(10) as u8,
                    };
                }
                s = String::from_utf8_lossy(&b).into_owned();
            }
            2..=5 => {
                let mut lines: Vec<String> = s.lines().map(str::to_string).collect();
                if lines.is_empty() {
                    continue;
                }
                let i = r.below(lines.len());
                match r.below(5) {
                    0 => {
                        let l = lines[i].clone();
                        lines.insert(i, l);
                    }
                    1 => {
                        lines.remove(i);
                    }
                    2 => {
                        let j = r.below(lines.len());
                        lines.swap(i, j);
                    }
                    3 => {
                        let l = lines[i].clone();
                        let k = r.range(2, 200);
                        for _ in 0..k {
                            lines.insert(i, l.clone());
                        }
                    }
                    _ => {
                        let words: Vec<&str> = lines[i].split(' ').collect();
                        let w = r.below(words.len() + 1);
                        let tok = r.pick(&[
                            "!",
                            "-j",
                            "-m",
                            "--",
                            "\"",
                            "-A",
                            "*filter",
                            "COMMIT",
                            ":",
                            "[0:0]",
                            "-p tcp",
                            "--dport",
                            "-4",
                            "-6",
                            "-g",
                            "--comment",
                        ]);
                        let mut ws: Vec<String> = words.iter().map(|x| x.to_string()).collect();
                        ws.insert(w, tok.to_string());
                        lines[i] = ws.join(" ");
                    }
                }
                s = lines.join("\n");
                if r.chance(800) {
                    s.push('\n');
                }
            }
            6 => {
                let at = floor_boundary(&s, r.below(s.len() + 1));
                let ins = r.pick(&[
                    "\0",
                    "é",
                    "\u{FEFF}",
                    "\r\n",
                    "\r",
                    "\u{2028}",
                    "\x7f",
                    "\u{10FFFF}",
                ]);
                s.insert_str(at, ins);
            }
            7 => {
                // A number made huge.
                if let Some(pos) = s.find(|c: char| c.is_ascii_digit()) {
                    let huge = r.pick(&[
                        "99999999999999999999999",
                        "18446744073709551616",
                        "4294967296",
                        "65536",
                        "-0",
                    ]);
                    s.replace_range(pos..pos + 1, huge);
                }
            }
            8 => {
                // Whitespace games.
                s = match r.below(3) {
                    0 => s.replace(' ', "  "),
                    1 => s.replace(' ', "\t"),
                    _ => s.replace('\n', " \n"),
                };
            }
            9 => {
                let text2 = restore_text(r, false);
                let at = floor_boundary(&s, r.below(s.len() + 1));
                s.insert_str(at, &text2);
            }
            _ => {
                s = format!("{}{}", s.trim_end_matches("COMMIT\n"), "");
            }
        }
    }
    if s.len() > max_bytes {
        let at = floor_boundary(&s, max_bytes);
        s.truncate(at);
    }
    s
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A restore text for a request: valid, grammar-made, mutated, or one of the big shapes
/// (deep jumps, many chains, many rules) within `caps`.
pub fn any_restore_text(r: &mut Rng, v6: bool, caps: &Caps) -> String {
    let max = caps.request_bytes;
    match r.below(41) {
        0..=15 => valid_text(r),
        16..=21 => restore_text(r, v6),
        22..=33 => {
            let base = if r.chance(500) {
                valid_text(r)
            } else {
                restore_text(r, v6)
            };
            mutate_text(r, &base, max)
        }
        34 => {
            let n = *r
                .pick(&[&1usize, &63, &64, &65, &66, &200])
                .min(&caps.deep_max.max(1));
            let n = if r.chance(300) {
                r.range(1, caps.deep_max.max(1))
            } else {
                n
            };
            deep_chain(n, r.chance(300))
        }
        35 => flat_chains(r.range(1, caps.chains_max.max(1)), r.chance(500)),
        36 => {
            let n = r.range(100, 3000);
            many_rules(r, n)
        }
        37 => random_text(r, 400),
        39 => address_lists(r, v6),
        38 => {
            let base = deep_chain(r.range(60, 70.min(caps.deep_max.max(60))), r.chance(200));
            mutate_text(r, &base, max)
        }
        _ => String::new(),
    }
}

/// `n` distinct addresses of the family, as `-s`/`-d` list items.
fn address_list(r: &mut Rng, n: usize, v6: bool) -> String {
    let base = r.below(200);
    (0..n)
        .map(|i| {
            if v6 {
                format!("2001:db8:{base:x}::{:x}", i + 1)
            } else {
                format!("10.{base}.{}.{}", i / 256, i % 256)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `-s a,b,...` / `-d a,b,...` lines (issue #28 item 1: each line stands for sources x
/// destinations rules): small lists, lists just under and far over `--max-rules` (up to 2,000
/// x 2,000 = 4,000,000 rules in ~60 KB), some lines of many lists.
pub fn address_lists(r: &mut Rng, v6: bool) -> String {
    let mut out = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for _ in 0..r.range(1, 4) {
        let (s, d) = match r.below(5) {
            0 => (r.range(1, 4), r.range(1, 4)),
            1 => (r.range(100, 316), r.range(100, 316)),
            2 => (r.range(1000, 2000), r.range(1000, 2000)),
            3 => (r.range(1, 2000), 1),
            _ => (r.range(2, 50), r.range(2, 50)),
        };
        let side = |r: &mut Rng, n: usize| -> String {
            if n == 1 && r.chance(500) {
                String::new()
            } else {
                address_list(r, n, v6)
            }
        };
        let (src, dst) = (side(r, s), side(r, d));
        let mut line = r
            .pick(&["-A INPUT", "-I INPUT", "-D INPUT", "-R INPUT 1"])
            .to_string();
        if !src.is_empty() {
            line.push_str(&format!(" -s {src}"));
        }
        if !dst.is_empty() {
            line.push_str(&format!(" -d {dst}"));
        }
        line.push_str(r.pick(&[" -j DROP", " -p tcp --dport 22 -j ACCEPT", " -j REJECT"]));
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str("COMMIT\n");
    out
}

/// The words of one iptables command for EditRuleset's `RuleCommand.args` (`-A INPUT -s
/// ... -j DROP`): every command (edits and not: `-C`, `-L`, `-Z`), rules from the restore
/// grammar, address lists, chains that exist and that do not, and now and then noise.
pub fn edit_args(r: &mut Rng) -> Vec<String> {
    let chain = r.pick(&[
        "INPUT",
        "OUTPUT",
        "FORWARD",
        "USERS",
        "NOPE",
        "",
        "PREROUTING",
    ]);
    let mut words: Vec<String> = match r.below(14) {
        0..=4 => vec!["-A".into(), chain.into()],
        5 => vec![
            "-I".into(),
            chain.into(),
            r.pick(&["1", "2", "0", "99", "-1"]).into(),
        ],
        6 => vec!["-D".into(), chain.into()],
        7 => vec!["-R".into(), chain.into(), r.pick(&["1", "3", "0"]).into()],
        8 => vec!["-N".into(), chain.into()],
        9 => vec!["-X".into(), chain.into()],
        10 => vec!["-F".into(), chain.into()],
        11 => vec![
            "-P".into(),
            chain.into(),
            r.pick(&["ACCEPT", "DROP", "RETURN", ""]).into(),
        ],
        12 => vec![
            "-E".into(),
            chain.into(),
            r.pick(&["USERS2", "INPUT", ""]).into(),
        ],
        _ => vec![
            r.pick(&["-C", "-L", "-Z", "-S", "--append", "", "-A -A"])
                .into(),
            chain.into(),
        ],
    };
    if matches!(words[0].as_str(), "-A" | "-I" | "-D" | "-R" | "-C") {
        let spec = match r.below(6) {
            0 => {
                let (s, d) = match r.below(3) {
                    0 => (r.range(2, 20), r.range(2, 20)),
                    1 => (r.range(300, 320), r.range(300, 320)),
                    _ => (r.range(1000, 2000), r.range(1000, 2000)),
                };
                let v6 = r.chance(200);
                format!(
                    "-s {} -d {} -j DROP",
                    address_list(r, s, v6),
                    address_list(r, d, v6)
                )
            }
            1 => random_text(r, 60),
            _ => {
                let v6 = r.chance(100);
                rule_spec(r, "filter", &["USERS".to_string()], v6)
            }
        };
        words.extend(spec.split_whitespace().map(str::to_string));
    }
    if r.chance(50) {
        words.push(random_text(r, 20));
    }
    words
}

// === structured rulesets ===

fn negatable(r: &mut Rng, values: &[&str]) -> Option<pb::Negatable> {
    if r.chance(600) {
        return None;
    }
    Some(pb::Negatable {
        negated: r.chance(150),
        value: if r.chance(900) {
            r.pick(values).to_string()
        } else {
            random_text(r, 12)
        },
    })
}

fn extension(r: &mut Rng, names: &[&str], opts: &[(&str, &[&str])]) -> pb::Extension {
    let name = if r.chance(900) {
        r.pick(names).to_string()
    } else {
        weird_name(r)
    };
    let n = r.small(4);
    let options = (0..n)
        .map(|_| {
            let (o, args) = opts[r.below(opts.len())];
            pb::ExtensionOption {
                negated: r.chance(100),
                name: if r.chance(950) {
                    o.to_string()
                } else {
                    random_text(r, 8)
                },
                args: (0..r.small(3))
                    .map(|_| {
                        if r.chance(900) && !args.is_empty() {
                            r.pick(args).to_string()
                        } else {
                            random_text(r, 10)
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    pb::Extension { name, options }
}

const MATCH_NAMES: &[&str] = &[
    "tcp",
    "udp",
    "multiport",
    "conntrack",
    "state",
    "iprange",
    "set",
    "comment",
    "mark",
    "length",
    "limit",
    "mac",
    "icmp",
    "icmp6",
    "addrtype",
    "nosuch",
];
const MATCH_OPTS: &[(&str, &[&str])] = &[
    ("--dport", &["22", "1:1023", "65536"]),
    ("--sport", &["53", "x"]),
    ("--dports", &["22,80,443", "1:2,3"]),
    ("--ctstate", &["ESTABLISHED,RELATED", "NEW", "BOGUS"]),
    ("--state", &["NEW"]),
    ("--src-range", &["192.0.2.1-192.0.2.9"]),
    ("--match-set", &["s0", "s1", "src", "dst"]),
    ("--comment", &["hello", ""]),
    ("--mark", &["0x1/0xff"]),
    ("--length", &["1000:"]),
    ("--limit", &["5/sec"]),
    ("--mac-source", &["02:00:00:00:00:01"]),
    ("--icmp-type", &["echo-request", "8"]),
    ("--tcp-flags", &["SYN,ACK", "SYN"]),
    ("--syn", &[]),
];
const TARGET_NAMES: &[&str] = &[
    "ACCEPT",
    "DROP",
    "RETURN",
    "REJECT",
    "LOG",
    "u0",
    "u1",
    "NOSUCH",
    "",
    "NOTRACK",
    "DNAT",
    "MASQUERADE",
    "MARK",
];
const TARGET_OPTS: &[(&str, &[&str])] = &[
    (
        "--reject-with",
        &["tcp-reset", "icmp-host-prohibited", "bogus"],
    ),
    ("--log-prefix", &["x: "]),
    ("--to-destination", &["198.51.100.7:80"]),
    ("--set-mark", &["0x1"]),
];

/// A structured ruleset (RulesetSpec) of random tables, chains and rules, valid-ish.
pub fn ruleset_spec(r: &mut Rng) -> pb::RulesetSpec {
    let ntables = r.small(3).max(if r.chance(950) { 1 } else { 0 });
    let tables = (0..ntables)
        .map(|_| {
            let (table, builtins) = TABLES[if r.chance(700) {
                0
            } else {
                r.below(TABLES.len())
            }];
            let family = *r.pick(&[&0i32, &1, &1, &2, &7]);
            let v6 = family == 2;
            let mut chains: Vec<pb::ChainSpec> = Vec::new();
            for b in builtins {
                if r.chance(700) {
                    chains.push(pb::ChainSpec {
                        name: b.to_string(),
                        policy: r
                            .pick(&["ACCEPT", "DROP", "", "RETURN", "accept"])
                            .to_string(),
                        rules: vec![],
                    });
                }
            }
            for i in 0..r.small(5) {
                chains.push(pb::ChainSpec {
                    name: if r.chance(900) {
                        format!("u{i}")
                    } else {
                        weird_name(r)
                    },
                    policy: if r.chance(950) {
                        String::new()
                    } else {
                        "ACCEPT".into()
                    },
                    rules: vec![],
                });
            }
            if chains.is_empty() && r.chance(800) {
                chains.push(pb::ChainSpec {
                    name: "INPUT".into(),
                    policy: "ACCEPT".into(),
                    rules: vec![],
                });
            }
            for c in chains.iter_mut() {
                for _ in 0..r.small(8) {
                    let target = if r.chance(900) {
                        Some(extension(r, TARGET_NAMES, TARGET_OPTS))
                    } else {
                        None
                    };
                    c.rules.push(pb::RuleSpec {
                        source: negatable(r, if v6 { V6_ADDRS } else { V4_ADDRS }),
                        destination: negatable(r, if v6 { V6_ADDRS } else { V4_ADDRS }),
                        in_interface: negatable(r, IFACES),
                        out_interface: negatable(r, IFACES),
                        protocol: negatable(r, PROTOS),
                        matches: (0..r.small(4))
                            .map(|_| extension(r, MATCH_NAMES, MATCH_OPTS))
                            .collect(),
                        target,
                        goto: r.chance(50),
                        fragment: r
                            .pick(&["", "", "", "fragment", "not-fragment", "bogus"])
                            .to_string(),
                    });
                }
            }
            pb::TableSpec {
                family,
                table: if r.chance(950) {
                    table.to_string()
                } else {
                    weird_name(r)
                },
                chains,
            }
        })
        .collect();
    pb::RulesetSpec { tables }
}

/// A ruleset source: restore text (often), structured, or none.
pub fn source(r: &mut Rng, caps: &Caps) -> Option<pb::RulesetSource> {
    use pb::ruleset_source::Source;
    match r.below(20) {
        0 => None,
        1 => Some(pb::RulesetSource { source: None }),
        2..=5 => Some(pb::RulesetSource {
            source: Some(Source::Structured(ruleset_spec(r))),
        }),
        _ => {
            let v6 = r.chance(200);
            let content = any_restore_text(r, v6, caps);
            let content_v6 = if r.chance(150) {
                any_restore_text(r, true, caps)
            } else {
                String::new()
            };
            Some(pb::RulesetSource {
                source: Some(Source::Text(pb::RestoreText {
                    content,
                    family: if v6 {
                        2
                    } else {
                        *r.pick(&[&0i32, &1, &1, &1, &3, &-1])
                    },
                    content_v6,
                    filename: match r.below(10) {
                        0 => weird_name(r),
                        1 => "x".repeat(5000),
                        _ => String::new(),
                    },
                    ..Default::default()
                })),
            })
        }
    }
}

/// A duration: absent (often), an hour, zero, negative, huge or with bad nanos. Never a short
/// positive one: a commit-confirmed deadline that fires between two checks would change
/// the state without a request.
pub fn confirm_within(r: &mut Rng) -> Option<prost_types::Duration> {
    let (seconds, nanos) = match r.below(40) {
        0 => (3600, 0),
        1 => (0, 0),
        2 => (-5, 0),
        3 => (i64::MAX, 999_999_999),
        4 => (3600, -1),
        // Out of the proto range (nanos < 1e9), taken today as 3601 s; (0, 1e9) would be a
        // 1 s deadline, which fires between two checks.
        5 => (3600, 1_000_000_000),
        6 => (86_400 * 365 * 1000, 0),
        7 => (i64::MIN, -999_999_999),
        _ => return None,
    };
    Some(prost_types::Duration { seconds, nanos })
}

// === ipset save text ===

const SET_TYPES: &[&str] = &[
    "hash:ip",
    "hash:net",
    "hash:ip,port",
    "hash:net,port",
    "hash:mac",
    "list:set",
    "bitmap:port",
    "hash:",
];

/// An element in ipset syntax for `ty` (valid most of the time).
pub fn element_text(r: &mut Rng, ty: &str, v6: bool) -> String {
    let host = if v6 {
        format!("2001:db8::{:x}", r.below(65536))
    } else {
        format!("10.{}.{}.{}", r.below(256), r.below(256), r.below(256))
    };
    let base = match r.below(30) {
        0 => format!(
            "{host}/{}",
            r.pick(&["8", "16", "24", "32", "0", "33", "129", "x"])
        ),
        1 => r
            .pick(&[
                "",
                " ",
                "-",
                "1.2.3.4-1.2.3.9",
                "::",
                "0.0.0.0",
                "300.1.1.1",
                "10.0.0.0/8",
            ])
            .to_string(),
        2 => random_text(r, 20),
        _ => host,
    };
    if ty.ends_with(",port") && r.chance(900) {
        format!(
            "{base},{}",
            r.pick(&[
                "tcp:80",
                "udp:53-54",
                "80",
                "sctp:1",
                "udplite:9",
                "icmp:8",
                "tcp:0-65535",
                "tcp:70000",
                "bogus:1"
            ])
        )
    } else {
        base
    }
}

/// `ipset save` text: create and add lines for 1-3 sets, sometimes mutated.
pub fn ipset_text(r: &mut Rng, max_bytes: usize) -> String {
    let mutate = r.chance(400);
    let mut s = String::new();
    for _ in 0..r.range(0, 3) {
        let name = set_name(r).replace('\n', "");
        let ty = if r.chance(900) {
            r.pick(&SET_TYPES[..4])
        } else {
            r.pick(SET_TYPES)
        };
        let v6 = r.chance(200);
        let bad = r.chance(200);
        let mut create = if bad {
            format!(
                "create {name} {ty} family {} hashsize {} maxelem {}",
                r.pick(&["inet", "inet6", "bogus", ""]),
                r.pick(&["1024", "64", "0", "3", "4294967296"]),
                r.pick(&["65536", "10", "0", "4294967295", "-1"])
            )
        } else {
            format!(
                "create {name} {ty} family {} hashsize 1024 maxelem 65536",
                if v6 { "inet6" } else { "inet" }
            )
        };
        // Never timeouts in a text that may be mutated: a mutated `timeout 100000` can become
        // `timeout 1`, and an element that expires changes the state without a request.
        let timeouts = r.chance(200) && !mutate;
        if timeouts {
            create.push_str(&format!(
                " timeout {}",
                r.pick(&["0", "100000", "2147483", "2147484"])
            ));
        }
        if r.chance(200) {
            create.push_str(" counters");
        }
        s.push_str(&create);
        s.push('\n');
        for _ in 0..r.small(30) {
            let mut add = format!("add {name} {}", element_text(r, ty, v6));
            if timeouts && r.chance(300) {
                add.push_str(&format!(
                    " timeout {}",
                    r.pick(&["0", "100000", "2147484", "x"])
                ));
            }
            if r.chance(50) {
                add.push_str(" packets 5 bytes 300");
            }
            s.push_str(&add);
            s.push('\n');
        }
    }
    if r.chance(100) {
        s.push_str(r.pick(&[
            "flush s0\n",
            "destroy s0\n",
            "swap s0 s1\n",
            "-exist\n",
            "COMMIT\n",
        ]));
    }
    if mutate {
        mutate_text(r, &s, max_bytes)
    } else {
        s
    }
}

/// A set element request item for a set of type `ty` (mostly): text (often) or structured
/// fields.
pub fn set_element(r: &mut Rng, ty: &str) -> pb::SetElement {
    let ty = if r.chance(900) {
        ty
    } else {
        r.pick(&SET_TYPES[..4])
    };
    let v6 = r.chance(50);
    let timeout = match r.below(30) {
        0 => Some(0),
        1 => Some(100_000),
        2 => Some(u32::MAX),
        3 => Some(2_147_484),
        _ => None,
    };
    if r.chance(750) {
        pb::SetElement {
            text: element_text(r, ty, v6),
            timeout,
            ..Default::default()
        }
    } else {
        pb::SetElement {
            text: if r.chance(100) {
                "10.0.0.1".into()
            } else {
                String::new()
            },
            address: if r.chance(900) {
                element_text(r, "hash:ip", v6)
            } else {
                random_text(r, 10)
            },
            prefix_len: *r.pick(&[&0u32, &0, &8, &24, &32, &33, &128, &129, &u32::MAX]),
            protocol: r
                .pick(&["", "tcp", "udp", "sctp", "udplite", "icmp", "TCP", "x"])
                .to_string(),
            port: *r.pick(&[&0u32, &80, &65535, &65536, &u32::MAX]),
            timeout,
            packets: r.below(3) as u64,
            bytes: 0,
        }
    }
}

// === packets ===

/// A packet spec for TracePacket: a plausible one (often) or one of random fields.
pub fn packet_spec(r: &mut Rng) -> pb::PacketSpec {
    if r.chance(600) {
        let v6 = r.chance(200);
        let proto = r.pick(&["tcp", "udp", "icmp", ""]);
        return pb::PacketSpec {
            family: if v6 { 2 } else { 1 },
            hook: *r.pick(&[&0i32, &1, &2, &3, &4, &5]),
            source: if v6 {
                "2001:db8::1".into()
            } else {
                format!("10.{}.0.{}", r.below(256), r.below(256))
            },
            destination: if v6 {
                "2001:db8::2".into()
            } else {
                "192.0.2.7".into()
            },
            protocol: if v6 && proto == "icmp" {
                "ipv6-icmp".into()
            } else {
                proto.to_string()
            },
            source_port: if proto == "tcp" || proto == "udp" {
                r.range(1, 65535) as u32
            } else {
                0
            },
            destination_port: if proto == "tcp" || proto == "udp" {
                *r.pick(&[&22u32, &80, &53, &443])
            } else {
                0
            },
            tcp_flags: if proto == "tcp" {
                r.pick(&["S", "SA", "A", "FA"]).to_string()
            } else {
                String::new()
            },
            icmp_type: if proto == "icmp" { 8 } else { 0 },
            in_interface: r.pick(&["", "eth0", "lo"]).to_string(),
            ct_state: r.pick(&["", "", "NEW", "ESTABLISHED"]).to_string(),
            ..Default::default()
        };
    }
    let v6 = r.chance(250);
    pb::PacketSpec {
        family: *r.pick(&[&0i32, &1, &1, &2, &9]) + if v6 { 1 } else { 0 },
        // HOOK_UNSPECIFIED ... HOOK_POSTROUTING and numbers that are no hook.
        hook: *r.pick(&[&0i32, &1, &2, &3, &4, &5, &6, &-1]),
        source: r
            .pick(&[
                "192.0.2.1",
                "10.1.2.3",
                "2001:db8::1",
                "",
                "300.0.0.1",
                "10.0.0.0/8",
                "::1",
            ])
            .to_string(),
        destination: r
            .pick(&["198.51.100.7", "127.0.0.1", "2001:db8::2", "", "x"])
            .to_string(),
        protocol: r
            .pick(&[
                "tcp",
                "udp",
                "icmp",
                "6",
                "17",
                "1",
                "58",
                "ipv6-icmp",
                "",
                "256",
                "gre",
            ])
            .to_string(),
        source_port: *r.pick(&[&0u32, &1234, &53, &65535, &65536, &u32::MAX]),
        destination_port: *r.pick(&[&0u32, &22, &80, &443, &65535, &65536]),
        tcp_flags: r
            .pick(&["", "S", "SA", "FSRPAU", "A", "X", "SS"])
            .to_string(),
        icmp_type: *r.pick(&[&0u32, &8, &3, &255, &256, &13]),
        icmp_code: *r.pick(&[&0u32, &1, &255, &256]),
        length: *r.pick(&[&0u32, &60, &20, &1500, &65535, &65536, &u32::MAX, &1]),
        in_interface: r
            .pick(&["", "eth0", "lo", "xxxxxxxxxxxxxxxxxxxx", "a b"])
            .to_string(),
        out_interface: r.pick(&["", "eth1", "+"]).to_string(),
        mark: *r.pick(&[&0u32, &1, &0x10, &u32::MAX]),
        ct_state: r
            .pick(&[
                "",
                "NEW",
                "ESTABLISHED",
                "RELATED",
                "INVALID",
                "UNTRACKED",
                "new",
                "BOGUS",
            ])
            .to_string(),
        source_mac: r
            .pick(&["", "02:00:00:AA:bb:01", "zz", "02:00:00:00:00:00:00"])
            .to_string(),
        physdev_in: r
            .pick(&["", "", "tap1", "xxxxxxxxxxxxxxxxxxxx"])
            .to_string(),
        physdev_out: r.pick(&["", "", "tap2", "eth0"]).to_string(),
    }
}

/// An IP packet (IPv4 or IPv6) with a TCP, UDP, ICMP or random layer 4, fields random,
/// lengths right most of the time.
pub fn ip_packet(r: &mut Rng) -> Vec<u8> {
    let v6 = r.chance(300);
    let proto: u8 = *r.pick(&[&6u8, &17, &1, &58, &47, &132, &0, &255]);
    let mut l4 = match proto {
        6 => {
            let mut t = vec![0u8; 20];
            t[0..2].copy_from_slice(&(r.below(65536) as u16).to_be_bytes());
            t[2..4].copy_from_slice(&r.pick(&[&22u16, &80, &443, &0]).to_be_bytes());
            t[12] = if r.chance(900) {
                5 << 4
            } else {
                (r.below(16) as u8) << 4
            };
            t[13] = r.below(256) as u8;
            t
        }
        17 => {
            let mut u = vec![0u8; 8];
            u[2..4].copy_from_slice(&53u16.to_be_bytes());
            u[4..6].copy_from_slice(&(8u16).to_be_bytes());
            u
        }
        1 | 58 => vec![r.below(256) as u8, r.below(256) as u8, 0, 0, 0, 0, 0, 0],
        _ => (0..r.small(40)).map(|_| r.below(256) as u8).collect(),
    };
    let extra = r.small(200);
    l4.extend((0..extra).map(|_| r.below(256) as u8));
    let mut p = Vec::new();
    if v6 {
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        let len = if r.chance(900) {
            l4.len() as u16
        } else {
            r.below(65536) as u16
        };
        p.extend_from_slice(&len.to_be_bytes());
        p.push(if r.chance(950) { proto } else { 0 }); // 0: hop-by-hop header next
        p.push(64);
        p.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        let ihl = if r.chance(900) { 5 } else { r.below(16) as u8 };
        p.push(0x40 | ihl);
        p.push(0);
        let len = if r.chance(900) {
            (20 + l4.len()) as u16
        } else {
            r.below(65536) as u16
        };
        p.extend_from_slice(&len.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        let frag: u16 = if r.chance(900) {
            0x4000
        } else {
            r.below(65536) as u16
        };
        p.extend_from_slice(&frag.to_be_bytes());
        p.push(64);
        p.push(proto);
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&[192, 0, 2, r.below(256) as u8]);
        p.extend_from_slice(&[198, 51, 100, 7]);
        for _ in 5..ihl.max(5) {
            p.extend_from_slice(&[1, 1, 1, 1]);
        }
    }
    p.extend_from_slice(&l4);
    p
}

/// An Ethernet frame (maybe VLAN-tagged, maybe a random ethertype) around [`ip_packet`].
pub fn ether_frame(r: &mut Rng) -> Vec<u8> {
    let ip = ip_packet(r);
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0xaa, 0xbb, 0x01];
    if r.chance(100) {
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    }
    let et: u16 = if ip[0] >> 4 == 6 { 0x86dd } else { 0x0800 };
    let et = if r.chance(900) {
        et
    } else {
        *r.pick(&[&0x0806u16, &0x88cc, &0, &0xffff, &0x8100])
    };
    f.extend_from_slice(&et.to_be_bytes());
    f.extend_from_slice(&ip);
    f
}

/// Bytes mutated: truncated, bits flipped, extended with noise.
pub fn mutate_bytes(r: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..r.range(1, 3) {
        match r.below(4) {
            0 => {
                let n = r.below(b.len() + 1);
                b.truncate(n);
            }
            1 if !b.is_empty() => {
                for _ in 0..r.range(1, 6) {
                    let i = r.below(b.len());
                    b[i] ^= 1 << r.below(8);
                }
            }
            2 if !b.is_empty() => {
                let i = r.below(b.len());
                b[i] = *r.pick(&[&0u8, &0xff, &0x7f, &0x80]);
            }
            _ => {
                let n = r.small(64);
                b.extend((0..n).map(|_| r.below(256) as u8));
            }
        }
    }
}

/// A frame for TracePacket: valid-ish, truncated, random or empty; `raw_ip` says whether it
/// starts at the IP header.
pub fn frame(r: &mut Rng) -> (Vec<u8>, bool) {
    let raw_ip = r.chance(300);
    let mut f = if raw_ip { ip_packet(r) } else { ether_frame(r) };
    match r.below(10) {
        0..=5 => {}
        6..=8 => mutate_bytes(r, &mut f),
        _ => f = (0..r.small(100)).map(|_| r.below(256) as u8).collect(),
    }
    (f, raw_ip)
}

/// A capture: classic pcap (either byte order, µs or ns) or pcapng, with Ethernet, raw IP,
/// Linux SLL or a random link type; records valid-ish, then maybe mutated (huge or short
/// lengths, truncation, flips).
pub fn capture(r: &mut Rng, max_bytes: usize) -> Vec<u8> {
    let link: u32 = *r.pick(&[&1u32, &1, &1, &101, &228, &229, &113, &0, &9999]);
    let n = r.small(200);
    let packets: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut p = if link == 1 {
                ether_frame(r)
            } else {
                ip_packet(r)
            };
            if r.chance(100) {
                mutate_bytes(r, &mut p);
            }
            p
        })
        .collect();
    let mut out = if r.chance(700) {
        pcap(r, link, &packets)
    } else {
        pcapng(r, link as u16, &packets)
    };
    match r.below(10) {
        0..=5 => {}
        6..=8 => mutate_bytes(r, &mut out),
        _ => out = (0..r.small(200)).map(|_| r.below(256) as u8).collect(),
    }
    out.truncate(max_bytes);
    out
}

fn pcap(r: &mut Rng, link: u32, packets: &[Vec<u8>]) -> Vec<u8> {
    let be = r.chance(200);
    let magic: u32 = if r.chance(200) {
        0xa1b2_3c4d
    } else {
        0xa1b2_c3d4
    };
    let mut o = Vec::new();
    let w32 = |o: &mut Vec<u8>, v: u32| {
        o.extend_from_slice(&if be { v.to_be_bytes() } else { v.to_le_bytes() })
    };
    let w16 = |o: &mut Vec<u8>, v: u16| {
        o.extend_from_slice(&if be { v.to_be_bytes() } else { v.to_le_bytes() })
    };
    w32(&mut o, magic);
    w16(&mut o, 2);
    w16(&mut o, 4);
    w32(&mut o, 0);
    w32(&mut o, 0);
    w32(&mut o, *r.pick(&[&65535u32, &262_144, &0, &u32::MAX, &10]));
    w32(&mut o, link);
    for (i, p) in packets.iter().enumerate() {
        w32(&mut o, i as u32);
        w32(&mut o, 0);
        let incl = match r.below(100) {
            0 => u32::MAX,
            1 => p.len() as u32 + 1,
            2 => 0x0100_0000,
            _ => p.len() as u32,
        };
        w32(&mut o, incl);
        w32(&mut o, if r.chance(50) { 0 } else { p.len() as u32 });
        o.extend_from_slice(p);
    }
    o
}

fn pcapng(r: &mut Rng, link: u16, packets: &[Vec<u8>]) -> Vec<u8> {
    let mut o = Vec::new();
    let block = |o: &mut Vec<u8>, ty: u32, body: &[u8], r: &mut Rng| {
        let pad = (4 - body.len() % 4) % 4;
        let total = (12 + body.len() + pad) as u32;
        let total = match r.below(200) {
            0 => u32::MAX,
            1 => 8,
            2 => total + 4,
            _ => total,
        };
        o.extend_from_slice(&ty.to_le_bytes());
        o.extend_from_slice(&total.to_le_bytes());
        o.extend_from_slice(body);
        o.extend(std::iter::repeat_n(0, pad));
        o.extend_from_slice(&total.to_le_bytes());
    };
    // Section header: byte-order magic, version 1.0, section length -1.
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut o, 0x0a0d_0d0a, &shb, r);
    let nif = if r.chance(950) { 1 } else { r.below(3) };
    for _ in 0..nif {
        let mut idb = Vec::new();
        idb.extend_from_slice(&link.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&262_144u32.to_le_bytes());
        if r.chance(100) {
            // if_tsresol option (code 9, length 1), then end of options.
            idb.extend_from_slice(&[
                9,
                0,
                1,
                0,
                *r.pick(&[&6u8, &9, &0x80, &0xff]),
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            ]);
        }
        block(&mut o, 1, &idb, r);
    }
    for p in packets {
        let mut epb = Vec::new();
        let iface: u32 = if r.chance(980) { 0 } else { r.below(5) as u32 };
        epb.extend_from_slice(&iface.to_le_bytes());
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&0u32.to_le_bytes());
        let cap = if r.chance(990) {
            p.len() as u32
        } else {
            u32::MAX
        };
        epb.extend_from_slice(&cap.to_le_bytes());
        epb.extend_from_slice(&(p.len() as u32).to_le_bytes());
        epb.extend_from_slice(p);
        let ty = if r.chance(950) {
            6
        } else {
            *r.pick(&[&3u32, &2, &0x0a0d_0d0a, &77])
        };
        block(&mut o, ty, &epb, r);
    }
    o
}

/// A conntrack filter of random fields.
pub fn conntrack_filter(r: &mut Rng) -> Option<pb::ConntrackFilter> {
    if r.chance(200) {
        return None;
    }
    Some(pb::ConntrackFilter {
        family: *r.pick(&[&0i32, &1, &2, &5]),
        protocol: r
            .pick(&["", "tcp", "udp", "icmp", "ipv6-icmp", "6", "300", "x"])
            .to_string(),
        source: r
            .pick(&[
                "",
                "10.0.0.0/8",
                "192.0.2.1",
                "2001:db8::/32",
                "10.0.0.0/33",
                "x",
            ])
            .to_string(),
        destination: r
            .pick(&["", "198.51.100.7", "::/0", "1.2.3.4/-1"])
            .to_string(),
        source_port: *r.pick(&[&0u32, &1234, &65535, &65536]),
        destination_port: *r.pick(&[&0u32, &80, &65536, &u32::MAX]),
        state: r
            .pick(&[
                "",
                "ESTABLISHED",
                "SYN_SENT",
                "TIME_WAIT",
                "bogus",
                "established",
            ])
            .to_string(),
    })
}
