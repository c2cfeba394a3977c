//! How much of a real pod `loadgen serve` sends: the [`PodProfile`] (docs/workloads.md, "Pod
//! profiles"). The workloads themselves do not depend on it (a key, a node and a version are
//! all an engine sees); it lives here because it names a property of the workload the server
//! replays, chosen on the same command lines as the workload.

/// How much of a real pod each served object carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PodProfile {
    /// A name, a namespace, two labels, one container and a node: about 330 bytes of JSON.
    Minimal,
    /// A Deployment's pod as a real API server holds it: 1-3 containers with env, probes,
    /// resources and mounts, the service-account volume, tolerations, `managedFields` and a
    /// running status (about 6 KB of JSON).
    #[default]
    Typical,
    /// Typical with init containers, two sidecars, ~40 env vars per container and more
    /// annotations (about 25 KB of JSON).
    Large,
}

impl PodProfile {
    /// Every profile, smallest first.
    pub const ALL: [PodProfile; 3] = [PodProfile::Minimal, PodProfile::Typical, PodProfile::Large];

    /// `minimal`, `typical`, `large`.
    pub fn name(self) -> &'static str {
        match self {
            PodProfile::Minimal => "minimal",
            PodProfile::Typical => "typical",
            PodProfile::Large => "large",
        }
    }
}

/// An unknown pod profile name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pod profile {0:?}: expected one of minimal, typical, large")]
pub struct UnknownPodProfile(pub String);

crate::display_and_parse_by_name!(PodProfile, UnknownPodProfile);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_typical_is_the_default() {
        for profile in PodProfile::ALL {
            assert_eq!(profile.name().parse::<PodProfile>(), Ok(profile));
        }
        assert_eq!("LARGE".parse::<PodProfile>(), Ok(PodProfile::Large));
        assert!("huge".parse::<PodProfile>().is_err());
        assert_eq!(PodProfile::default(), PodProfile::Typical);
    }
}
