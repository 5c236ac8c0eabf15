//! The steering's mark fields, parsed once for vallumd's flags and `vallumctl dataplane install`'s:
//! the reject field (which kernel REJECT answers a REJECT verdict) and the facts field (the bits of
//! the kernel-decided matches, [`crate::kernel_decided`]).

/// Parses a 32-bit mark, hex (`0x...`) or decimal, surrounding blanks ignored.
fn parse_mark(s: &str, example: &str) -> Result<u32, String> {
    let t = s.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse::<u32>(),
    }
    .map_err(|_| format!("{s:?} is not a 32-bit mark (e.g. {example})"))
}

/// Parses a reject mark field: 0 (none), or exactly 4 contiguous bits (`0x0f000000`), hex or
/// decimal.
///
/// Errors: a message naming the value (not a number, or not 4 contiguous bits).
pub fn parse_reject_mark(s: &str) -> Result<u32, String> {
    let v = parse_mark(s, "0x0f000000")?;
    if v != 0 && (v.count_ones() != 4 || (v >> v.trailing_zeros()) != 0xf) {
        return Err(format!(
            "{s:?}: the reject mark is 4 contiguous bits (e.g. 0x0f000000), or 0 for none"
        ));
    }
    Ok(v)
}

/// Parses a facts mark field: 0 (none), or 1 to 32 contiguous bits (`0x00ff0000`), hex or
/// decimal.
///
/// Errors: a message naming the value (not a number, or bits that are not contiguous).
pub fn parse_facts_mark(s: &str) -> Result<u32, String> {
    let v = parse_mark(s, "0x00ff0000")?;
    if v != 0 && v.leading_zeros() + v.trailing_zeros() + v.count_ones() != 32 {
        return Err(format!(
            "{s:?}: the facts mark is contiguous bits (e.g. 0x00ff0000), or 0 for none"
        ));
    }
    Ok(v)
}
