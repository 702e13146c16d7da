//! The names of the library's choices (an output format, a fit, an element type, ...): each
//! enum gets its list of names, `Display` and `FromStr` from one table, for a command line, a
//! configuration file or a message to show them.

/// A name that is none of its kind's: `unknown fit 'sideways' (expected exact, pad or stretch)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} '{name}' (expected {})", expected_list(.expected))]
pub struct UnknownName {
    /// What was named (`fit`, `output format`, ...).
    pub kind: &'static str,
    pub name: String,
    /// The names there are.
    pub expected: &'static [&'static str],
}

fn expected_list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// `ALL`, `NAMES`, `name()`, `Display` and `FromStr` of a fieldless enum, from its variants and
/// their names: `names!(FitMode, "fit", { Exact => "exact", Pad => "pad" });`.
macro_rules! names {
    ($ty:ident, $kind:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in the order of [`Self::NAMES`].
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// Every value's name.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The value's name, as it is written and parsed.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::names::UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| $crate::names::UnknownName {
                    kind: $kind,
                    name: s.to_owned(),
                    expected: Self::NAMES,
                })
            }
        }
    };
}

pub(crate) use names;

#[cfg(test)]
mod tests {
    use crate::fit::FitMode;
    use crate::outputs::npz::{Compression, NormalDtype};
    use crate::outputs::Format;
    use crate::protocol::OutputFormat;

    /// Every name parses back to its value, and on the wire (serde) the names are the same.
    #[test]
    fn names_round_trip_and_match_the_wire() {
        fn check<T: Copy + PartialEq + std::fmt::Debug + std::fmt::Display + std::str::FromStr>(all: &[T], names: &[&str]) {
            assert_eq!(all.len(), names.len());
            for (v, n) in all.iter().zip(names) {
                assert_eq!(v.to_string(), *n);
                assert_eq!(n.parse::<T>().ok(), Some(*v));
            }
        }
        fn wire<T: serde::Serialize>(all: &[T], names: &[&str]) {
            for (v, n) in all.iter().zip(names) {
                assert_eq!(serde_json::to_value(v).unwrap(), *n);
            }
        }
        check(FitMode::ALL, FitMode::NAMES);
        check(NormalDtype::ALL, NormalDtype::NAMES);
        check(Compression::ALL, Compression::NAMES);
        check(Format::ALL, Format::NAMES);
        check(OutputFormat::ALL, OutputFormat::NAMES);
        wire(FitMode::ALL, FitMode::NAMES);
        wire(NormalDtype::ALL, NormalDtype::NAMES);
        wire(OutputFormat::ALL, OutputFormat::NAMES);
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let e = "sideways".parse::<FitMode>().unwrap_err();
        assert_eq!(e.to_string(), "unknown fit 'sideways' (expected exact, pad or stretch)");
        assert_eq!("Pad".parse::<FitMode>().unwrap_err().expected, FitMode::NAMES);
        assert_eq!("float64".parse::<NormalDtype>().unwrap_err().to_string(), "unknown normal element type 'float64' (expected float16 or float32)");
    }
}
