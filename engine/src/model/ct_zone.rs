//! Conntrack zones (`-j CT --zone`, `--zone-orig`, `--zone-reply`): what a rule writes and
//! what a packet carries to the tracker.

/// `-j CT --zone N|mark`, `--zone-orig N|mark`, `--zone-reply N|mark` (xt_CT revision 2), as
/// libxt_CT reads them: the id is the last one written (each option sets it), the directions
/// are those of the `-orig` / `-reply` options given (none or both: both directions, the
/// kernel's `NF_CT_DEFAULT_ZONE_DIR`). iptables-save prints `--zone-orig` or `--zone-reply`
/// when exactly one direction was given, else `--zone`, and nothing for zone 0 without
/// `mark`: [`crate::restore`] keeps `None` then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtZoneSpec {
    /// The zone id (0-65535); unused with `from_mark`.
    pub id: u16,
    /// `mark`: the zone id is the packet mark's low 16 bits when the rule runs
    /// (`nf_ct_zone_tmpl` with `NF_CT_FLAG_MARK`).
    pub from_mark: bool,
    /// [`CtZone::ORIG`], [`CtZone::REPLY`] or both.
    pub dirs: u8,
}

impl CtZoneSpec {
    /// The zone a packet with mark `mark` gets from the rule.
    pub fn resolve(&self, mark: u32) -> CtZone {
        CtZone {
            id: if self.from_mark { mark as u16 } else { self.id },
            dirs: self.dirs,
        }
    }
}

/// The conntrack zone of a packet or an entry (`struct nf_conntrack_zone`): id `id` in the
/// directions of `dirs`, the default zone 0 in the others. Zone ids are part of the
/// connection key, direction by direction: a packet finds an entry only when the entry's zone
/// id in the direction the packet's tuple matched equals the packet's own id for that
/// direction (`nf_ct_zone_equal`), so the same addresses and ports in two zones are two
/// connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtZone {
    /// The zone id.
    pub id: u16,
    /// The directions `id` applies to: [`CtZone::ORIG`] | [`CtZone::REPLY`].
    pub dirs: u8,
}

impl CtZone {
    /// The original direction (`NF_CT_ZONE_DIR_ORIG`).
    pub const ORIG: u8 = 1;
    /// The reply direction (`NF_CT_ZONE_DIR_REPL`).
    pub const REPLY: u8 = 2;

    /// The zone id for direction `dir` (0 original, 1 reply), as `nf_ct_zone_id`.
    pub fn id(&self, dir: usize) -> u16 {
        if self.dirs & (1 << dir) != 0 {
            self.id
        } else {
            0
        }
    }
}

impl Default for CtZone {
    /// The default zone: id 0 in both directions.
    fn default() -> Self {
        CtZone {
            id: 0,
            dirs: CtZone::ORIG | CtZone::REPLY,
        }
    }
}
