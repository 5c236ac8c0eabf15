//! The digest tree of a content: each family's text cut into chunks of whole lines, each
//! chunk's sha256, and the root over them ([`Layout`]). The store keeps the text as these
//! chunks (`store/chunks.rs`), memory holds it as these chunks (`content/text.rs`), and a
//! revision's digest is the root, so a content made from another by a few changed rules
//! (`Text::splice`) hashes only the chunks those rules are in: the unchanged chunks and their
//! digests are the other content's.
//!
//! Cutting: content-defined, as rsync / restic / git's packs do to survive insertions: a chunk
//! ends after a line whose hash has its low [`BOUNDARY_BITS`] bits zero (so on average every
//! 64 lines), or at [`MAX_LINES`] lines. A boundary depends only on the lines since the last
//! one, so inserting or deleting a rule changes the chunk around it and no other. The
//! concatenation of a text's chunks is the text.
//!
//! The root: sha256 over the digests of the combined text's chunks in order (see
//! [`super::Content::combined`]): the IPv4 text's chunks, then, when there is IPv6 text, the
//! separator line as a chunk of its own and the IPv6 text's chunks. It is a function of the
//! text alone (two equal texts have the same root however they were made).

use sha2::{Digest, Sha256};

/// A chunk ends after a line whose hash has this many low bits zero (64 lines on average).
pub const BOUNDARY_BITS: u32 = 6;

/// A chunk ends after at most this many lines (bounds a chunk at ~16 KB of rules).
pub const MAX_LINES: usize = 256;

/// One chunk of a family's text: where it ends (byte offset, exclusive; it starts where the
/// one before ends) and the sha256 of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    /// Byte offset of its end in the family's text.
    pub end: usize,
    /// sha256 of its text.
    pub digest: [u8; 32],
}

/// The chunks of a content's IPv4 and IPv6 texts and the root digest over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The IPv4 text's chunks, in order.
    pub v4: Vec<ChunkRef>,
    /// The IPv6 text's chunks, in order.
    pub v6: Vec<ChunkRef>,
    /// sha256 over the chunk digests (see the module docs).
    pub root: [u8; 32],
}

impl Layout {
    /// The layout of `v4` and `v6` (the separator is [`super::V6_SEPARATOR`]), every chunk
    /// hashed: in proportion to the text.
    pub fn of(v4: &str, v6: &str) -> Layout {
        Layout::with(cut_all(v4), cut_all(v6), v6.is_empty())
    }

    /// The layout of chunks already cut and hashed ([`super::text::Text::chunks`]; `no_v6`:
    /// there is no IPv6 text).
    pub fn from_chunks(v4: Vec<ChunkRef>, v6: Vec<ChunkRef>, no_v6: bool) -> Layout {
        Layout::with(v4, v6, no_v6)
    }

    fn with(v4: Vec<ChunkRef>, v6: Vec<ChunkRef>, no_v6: bool) -> Layout {
        let mut h = Sha256::new();
        for c in &v4 {
            h.update(c.digest);
        }
        if !no_v6 {
            h.update(Sha256::digest(super::V6_SEPARATOR.as_bytes()));
            for c in &v6 {
                h.update(c.digest);
            }
        }
        Layout {
            v4,
            v6,
            root: h.finalize().into(),
        }
    }

    /// The root as lower-case hex (64 characters): a revision's digest.
    pub fn root_hex(&self) -> String {
        hex(&self.root)
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// A hash of one line for boundary decisions only (identity is the sha256): FxHash-style
/// multiply-rotate over 8-byte words, then a final avalanche so the low bits depend on every
/// byte.
fn line_hash(line: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = line.len() as u64;
    let mut words = line.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    }
    let mut b = [0u8; 8];
    b[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    // murmur3's fmix64.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// The end of the chunk of `text` that starts at `start` (a line start, before the end).
fn next_cut(text: &[u8], start: usize) -> usize {
    cut_from(text, start).0
}

/// [`next_cut`], and whether the chunk ends by the cutting rule (a boundary line, or
/// [`MAX_LINES`]) rather than by running out of `text`: only then is its end a cut whatever
/// follows.
pub(super) fn cut_from(text: &[u8], start: usize) -> (usize, bool) {
    let mask = (1u64 << BOUNDARY_BITS) - 1;
    let (mut pos, mut lines) = (start, 0);
    while pos < text.len() {
        let end = (text[pos..].iter())
            .position(|b| *b == b'\n')
            .map_or(text.len(), |i| pos + i + 1);
        lines += 1;
        let line = &text[pos..end];
        pos = end;
        if line_hash(line) & mask == 0 || lines >= MAX_LINES {
            return (pos, true);
        }
    }
    (pos, false)
}

/// Cuts `text` into chunks of whole lines (each with its `\n`; the last may lack one). The
/// chunks, concatenated, are `text`; an empty text has no chunks.
pub fn split(text: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(text.len() / 2048 + 1);
    let mut start = 0;
    while start < text.len() {
        let end = next_cut(text.as_bytes(), start);
        // Cuts are after a '\n' or at the end: char boundaries.
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn chunk(text: &[u8], start: usize, end: usize) -> ChunkRef {
    ChunkRef {
        end,
        digest: Sha256::digest(&text[start..end]).into(),
    }
}

fn cut_all(text: &str) -> Vec<ChunkRef> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 2048 + 1);
    let mut start = 0;
    while start < b.len() {
        let end = next_cut(b, start);
        out.push(chunk(b, start, end));
        start = end;
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A filter table of `n` rules (one INPUT chain), the text the content tests cut.
    pub(in crate::control::content) fn rules(n: usize) -> String {
        let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..n {
            s.push_str(&format!(
                "-A INPUT -s 10.{}.{}.0/24 -p tcp -m tcp --dport {} -j ACCEPT\n",
                i / 256 % 256,
                i % 256,
                i % 65536
            ));
        }
        s.push_str("COMMIT\n");
        s
    }

    #[test]
    fn chunks_join_back_to_the_text() {
        for text in [
            String::new(),
            "x".into(),
            "a\nb".into(),
            "a\n\n\n".into(),
            rules(5000),
        ] {
            let c = split(&text);
            assert_eq!(c.concat(), text);
            assert!(c.iter().all(|c| !c.is_empty()));
            // Every chunk but the last ends a line.
            assert!(c.iter().rev().skip(1).all(|c| c.ends_with('\n')));
        }
        let text = rules(5000);
        let c = split(&text);
        assert!(c.iter().all(|c| c.lines().count() <= MAX_LINES));
        // ~64 lines on average: far fewer chunks than lines, far more than one.
        assert!(c.len() > 20 && c.len() < 500, "{} chunks", c.len());
    }

    #[test]
    fn an_inserted_line_changes_one_chunk() {
        let a = rules(5000);
        let at = a.find("-A INPUT -s 10.9.").expect("rule present");
        let b = format!("{}-A INPUT -p udp -j DROP\n{}", &a[..at], &a[at..]);
        let ca: std::collections::HashSet<&str> = split(&a).into_iter().collect();
        let cb = split(&b);
        let new: Vec<&&str> = cb.iter().filter(|c| !ca.contains(**c)).collect();
        // The chunk holding the new line; one more only if the new line is itself a boundary.
        assert!(
            !new.is_empty() && new.len() <= 2,
            "{} new chunks",
            new.len()
        );
    }

    /// The root is sha256 over the chunk digests (and the separator's for IPv6), and the
    /// layout's chunks are `split`'s.
    #[test]
    fn the_root_is_over_the_chunk_digests() {
        let v4 = rules(700);
        let v6 = rules(300).replace("10.", "2001:db8:");
        let l = Layout::of(&v4, &v6);
        let mut h = Sha256::new();
        for c in split(&v4) {
            h.update(Sha256::digest(c.as_bytes()));
        }
        h.update(Sha256::digest(
            crate::control::content::V6_SEPARATOR.as_bytes(),
        ));
        for c in split(&v6) {
            h.update(Sha256::digest(c.as_bytes()));
        }
        assert_eq!(l.root, <[u8; 32]>::from(h.finalize()));
        assert_eq!(l.v4.len(), split(&v4).len());
        assert_eq!(l.v6.last().unwrap().end, v6.len());
        // No IPv6 text: the IPv4 chunks alone.
        let l = Layout::of(&v4, "");
        let mut h = Sha256::new();
        for c in split(&v4) {
            h.update(Sha256::digest(c.as_bytes()));
        }
        assert_eq!(l.root, <[u8; 32]>::from(h.finalize()));
        assert_eq!(
            Layout::of("", "").root,
            <[u8; 32]>::from(Sha256::digest(b""))
        );
    }
}
