//! Query parameters read before routing: what a request asks of the server's state before the
//! route looks at it (the full checks of each parameter are the route's, in `routes`).

/// The `resourceVersion` a request asks for, when it is a number newer than `current`: such a
/// request waits a while for the server to reach it, as the API server waits, before its
/// `504 ResourceVersionTooLarge`. A continued list page is pinned by its token, not this.
pub fn newer_resource_version(query: Option<&str>, current: u64) -> Option<u64> {
    let query = query?;
    let mut wanted = None;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "continue" if !value.is_empty() => return None,
            "resourceVersion" => wanted = value.parse::<u64>().ok(),
            _ => {}
        }
    }
    wanted.filter(|&rv| rv > current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_numeric_version_past_the_current_one_waits() {
        assert_eq!(
            newer_resource_version(Some("resourceVersion=12"), 10),
            Some(12)
        );
        assert_eq!(newer_resource_version(Some("resourceVersion=10"), 10), None);
        assert_eq!(
            newer_resource_version(Some("resourceVersion=abc"), 10),
            None
        );
        assert_eq!(newer_resource_version(None, 10), None);
        assert_eq!(
            newer_resource_version(Some("resourceVersion=99&continue=5-1"), 10),
            None
        );
    }
}
