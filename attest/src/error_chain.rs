//! How the binaries print an error for a person: the error and its causes on one line,
//! each said once. Many errors here put their source into their own message (`{path}:
//! {source}`) and also return it from `source()`; walking the chain naively would print
//! those causes twice.

/// `error: cause: deeper cause`, skipping a cause whose text is already in the line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading /k/host.key: {source}")]
    struct Repeats {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("starting rackwardend")]
    struct Context {
        #[source]
        source: Repeats,
    }

    #[test]
    fn each_cause_is_said_once() {
        let e = Context {
            source: Repeats {
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        };
        assert_eq!(
            error_chain(&e),
            "starting rackwardend: reading /k/host.key: entity not found"
        );
    }
}
