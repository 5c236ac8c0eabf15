//! The grammar check every typed extension reader shares. The line parser collects a `-m NAME`
//! extension's options as for an opaque one ([`OpaqueOption`]: name, `!`, arguments); each
//! typed reader (addrtype, connlimit, hashlimit, the header matches, recent, rpfilter, string)
//! describes its options once as a table of [`Opt`]s, and [`ExtOptions::check`] refuses what
//! libxtables' `xtables_option_parse` refuses before any value is read: an option the
//! extension does not have, one given twice, `!` before an option that cannot be inverted, and
//! an option with the wrong number of arguments. What is left to each reader is its values and
//! the rules between options. Every error is located at the extension's name token.

use crate::model::OpaqueOption;

use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// One option of an extension's grammar.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Opt {
    /// The option as written, `--name`.
    pub name: &'static str,
    /// It takes exactly one argument (otherwise none).
    pub arg: bool,
    /// `!` may precede it.
    pub negatable: bool,
}

impl Opt {
    /// An option with one argument that cannot be inverted.
    pub(crate) const fn value(name: &'static str) -> Self {
        Opt {
            name,
            arg: true,
            negatable: false,
        }
    }

    /// An option without an argument that cannot be inverted.
    pub(crate) const fn flag(name: &'static str) -> Self {
        Opt {
            name,
            arg: false,
            negatable: false,
        }
    }

    /// The same option, which `!` may precede.
    pub(crate) const fn negatable(self) -> Self {
        Opt {
            negatable: true,
            ..self
        }
    }
}

/// A typed extension's options once [`ExtOptions::check`] has accepted their grammar, with the
/// extension's name and location for the errors its reader still finds.
pub(crate) struct ExtOptions<'a, 't> {
    ext: &'a str,
    options: &'a [OpaqueOption],
    token: &'a Tok<'t>,
    ctx: &'a Ctx<'a>,
}

impl<'a, 't> ExtOptions<'a, 't> {
    /// Checks `options` against `grammar`, in the order given: the first option that is
    /// unknown (`UnknownExtensionOption`), given twice (`DuplicateOption`), inverted though it
    /// cannot be, or with the wrong argument count (`InvalidValue` "EXT: option ..."), is the
    /// error.
    pub(crate) fn check(
        ext: &'a str,
        grammar: &[Opt],
        options: &'a [OpaqueOption],
        token: &'a Tok<'t>,
        ctx: &'a Ctx<'a>,
    ) -> Result<Self, ParseError> {
        let r = ExtOptions {
            ext,
            options,
            token,
            ctx,
        };
        for (i, o) in options.iter().enumerate() {
            let Some(g) = grammar.iter().find(|g| g.name == o.name) else {
                return Err(ctx.err(
                    token,
                    K::UnknownExtensionOption {
                        extension: ext.into(),
                        option: o.name.clone(),
                    },
                ));
            };
            if options[..i].iter().any(|p| p.name == o.name) {
                return Err(ctx.err(token, K::DuplicateOption(o.name.clone())));
            }
            if o.negated && !g.negatable {
                return Err(r.bad(format!("option \"{}\" cannot be inverted", o.name)));
            }
            match (g.arg, o.args.len()) {
                (true, 1) | (false, 0) => {}
                (true, _) => {
                    return Err(r.bad(format!("option \"{}\" takes one argument", o.name)));
                }
                (false, _) => {
                    return Err(r.bad(format!("option \"{}\" takes no argument", o.name)));
                }
            }
        }
        Ok(r)
    }

    /// The options, in the order written.
    pub(crate) fn options(&self) -> &'a [OpaqueOption] {
        self.options
    }

    /// The checked option's argument; `""` for an option without one.
    pub(crate) fn arg(o: &OpaqueOption) -> &str {
        o.args.first().map_or("", String::as_str)
    }

    /// `InvalidValue` "EXT: `reason`" at the extension's name.
    pub(crate) fn bad(&self, reason: String) -> ParseError {
        self.ctx.err(
            self.token,
            K::InvalidValue {
                what: "extension option",
                reason: format!("{}: {reason}", self.ext),
            },
        )
    }

    /// `MissingOption`: the extension needs one of `needs`.
    pub(crate) fn missing(&self, needs: &'static str) -> ParseError {
        self.ctx.err(
            self.token,
            K::MissingOption {
                extension: self.ext.to_string(),
                needs,
            },
        )
    }
}
