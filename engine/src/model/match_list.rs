//! [`MatchList`]: a rule's `-m` matches, one inline and more in a `Vec`. Built on the commit
//! path; read as a slice on both.

use std::fmt;

use super::Match;

/// A rule's `-m` matches in written order, used as a slice (`Deref<Target = [Match]>`). Most
/// rules have at most one match: it is kept inline, so such a rule owns no heap block for its
/// matches, and cloning, comparing and dropping a large ruleset touches one array instead of
/// one allocation per rule. Two or more matches live in a `Vec`. Equality, hashing and `Debug`
/// are those of the slice.
#[derive(Clone, Default)]
pub struct MatchList(MatchRepr);

#[derive(Clone, Default)]
enum MatchRepr {
    #[default]
    Empty,
    One(Match),
    Many(Vec<Match>),
}

impl MatchList {
    /// No matches.
    pub const fn new() -> MatchList {
        MatchList(MatchRepr::Empty)
    }

    /// Appends a match.
    pub fn push(&mut self, m: Match) {
        self.0 = match std::mem::take(&mut self.0) {
            MatchRepr::Empty => MatchRepr::One(m),
            MatchRepr::One(first) => MatchRepr::Many(vec![first, m]),
            MatchRepr::Many(mut v) => {
                v.push(m);
                MatchRepr::Many(v)
            }
        };
    }

    /// Removes every match.
    pub fn clear(&mut self) {
        self.0 = MatchRepr::Empty;
    }

    /// The matches as a slice.
    pub fn as_slice(&self) -> &[Match] {
        match &self.0 {
            MatchRepr::Empty => &[],
            MatchRepr::One(m) => std::slice::from_ref(m),
            MatchRepr::Many(v) => v,
        }
    }

    /// The matches as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [Match] {
        match &mut self.0 {
            MatchRepr::Empty => &mut [],
            MatchRepr::One(m) => std::slice::from_mut(m),
            MatchRepr::Many(v) => v,
        }
    }
}

impl std::ops::Deref for MatchList {
    type Target = [Match];

    fn deref(&self) -> &[Match] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for MatchList {
    fn deref_mut(&mut self) -> &mut [Match] {
        self.as_mut_slice()
    }
}

impl PartialEq for MatchList {
    fn eq(&self, other: &MatchList) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for MatchList {}

impl std::hash::Hash for MatchList {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl fmt::Debug for MatchList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl From<Vec<Match>> for MatchList {
    fn from(mut v: Vec<Match>) -> MatchList {
        MatchList(match v.len() {
            0 => MatchRepr::Empty,
            1 => MatchRepr::One(v.pop().expect("one match")),
            _ => MatchRepr::Many(v),
        })
    }
}

impl FromIterator<Match> for MatchList {
    fn from_iter<I: IntoIterator<Item = Match>>(iter: I) -> MatchList {
        let mut list = MatchList::new();
        list.extend(iter);
        list
    }
}

impl Extend<Match> for MatchList {
    fn extend<I: IntoIterator<Item = Match>>(&mut self, iter: I) {
        for m in iter {
            self.push(m);
        }
    }
}

impl<'a> IntoIterator for &'a MatchList {
    type Item = &'a Match;
    type IntoIter = std::slice::Iter<'a, Match>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl<'a> IntoIterator for &'a mut MatchList {
    type Item = &'a mut Match;
    type IntoIter = std::slice::IterMut<'a, Match>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_mut_slice().iter_mut()
    }
}

impl IntoIterator for MatchList {
    type Item = Match;
    type IntoIter = std::vec::IntoIter<Match>;

    fn into_iter(self) -> Self::IntoIter {
        match self.0 {
            MatchRepr::Empty => Vec::new(),
            MatchRepr::One(m) => vec![m],
            MatchRepr::Many(v) => v,
        }
        .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault, Hash};

    use super::*;

    #[test]
    fn match_list_behaves_as_its_slice() {
        let ms: Vec<Match> = (0..4).map(|i| Match::Comment(format!("c{i}"))).collect();
        let hash = |x: &dyn Fn(&mut rustc_hash::FxHasher)| {
            let mut h = BuildHasherDefault::<rustc_hash::FxHasher>::default().build_hasher();
            x(&mut h);
            std::hash::Hasher::finish(&h)
        };
        for n in 0..=ms.len() {
            let mut list = MatchList::new();
            for m in &ms[..n] {
                list.push(m.clone());
            }
            assert_eq!(list.as_slice(), &ms[..n]);
            assert_eq!(list, MatchList::from(ms[..n].to_vec()));
            assert_eq!(list, ms[..n].iter().cloned().collect::<MatchList>());
            assert_eq!(list.clone().into_iter().collect::<Vec<_>>(), &ms[..n]);
            assert_eq!(format!("{list:?}"), format!("{:?}", ms[..n].to_vec()));
            assert_eq!(
                hash(&|h| list.hash(h)),
                hash(&|h| ms[..n].to_vec().hash(h)),
                "{n} matches"
            );
            if n > 0 {
                assert_ne!(list, MatchList::from(ms[..n - 1].to_vec()));
            }
            list.clear();
            assert!(list.is_empty());
        }
    }
}
