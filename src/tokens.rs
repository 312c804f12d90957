//! Bearer tokens and their roles, read from `auth.tokens_file`: who may call which
//! method. Three roles: `reader` may call the read-only methods, `agent` the methods of
//! `coloc.v1.ProfilingAgents` (what a profiling agent calls, and nothing else), `operator`
//! everything. Both the gRPC service (`api`'s auth layer) and the scheduler extender's
//! HTTP endpoint check requests here. Tokens are never logged.

use std::{collections::HashMap, path::Path};

use tonic::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    /// A profiling agent: the agent methods (and ListAgents), nothing of the advisor.
    Agent,
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reader => "reader",
            Self::Agent => "agent",
            Self::Operator => "operator",
        }
    }

    /// Whether a token of this role may call a method that needs `required`.
    fn may(self, required: Role) -> bool {
        matches!(
            (self, required),
            (Self::Operator, _)
                | (Self::Reader, Self::Reader)
                | (Self::Agent, Self::Agent | Self::Reader)
        )
    }
}

const SERVICE_PREFIX: &str = "/coloc.v1.ColocationAdvisor/";
const AGENTS_PREFIX: &str = "/coloc.v1.ProfilingAgents/";
/// Methods a `reader` may call; every other advisor method needs `operator`.
const READ_METHODS: [&str; 9] = [
    "Rank",
    "Place",
    "ListGpus",
    "Predict",
    "GetWorkload",
    "ListWorkloads",
    "GetModel",
    "ListModels",
    "GetModelReport",
];

/// The role a method needs; `None` for services outside the advisor (health, reflection).
pub fn required_role(path: &str) -> Option<Role> {
    if let Some(method) = path.strip_prefix(AGENTS_PREFIX) {
        return Some(if method == "ListAgents" {
            Role::Reader
        } else {
            Role::Agent
        });
    }
    let method = path.strip_prefix(SERVICE_PREFIX)?;
    Some(if READ_METHODS.contains(&method) {
        Role::Reader
    } else {
        Role::Operator
    })
}

/// The tokens file: one `ROLE TOKEN` per line; blank lines and `#` comments are skipped.
#[derive(Clone, Default)]
pub struct Tokens {
    roles: HashMap<String, Role>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.roles.len())
    }
}

/// Tokens containing this (any case) are refused: the placeholders shipped in deploy/.
const PLACEHOLDER_MARK: &str = "REPLACE-ME";

impl Tokens {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut roles = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(role), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {}: expected `ROLE TOKEN`", number + 1));
            };
            let role = match role {
                "reader" => Role::Reader,
                "operator" => Role::Operator,
                "agent" => Role::Agent,
                other => {
                    return Err(format!(
                        "line {}: unknown role {other:?} (reader, agent, operator)",
                        number + 1
                    ))
                }
            };
            if token.len() < 16 {
                return Err(format!(
                    "line {}: tokens must be at least 16 characters",
                    number + 1
                ));
            }
            // deploy/'s placeholder file deploys as it is; its tokens are public.
            if token.to_ascii_uppercase().contains(PLACEHOLDER_MARK) {
                return Err(format!(
                    "line {}: a placeholder token (it contains {PLACEHOLDER_MARK}); anyone who \
                     has read coloc's repository knows it: generate real tokens",
                    number + 1
                ));
            }
            roles.insert(token.to_string(), role);
        }
        if roles.is_empty() {
            return Err("the file holds no tokens".into());
        }
        Ok(Self { roles })
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The role of the request's bearer token, if it is a known one.
    pub fn role(&self, authorization: Option<&str>) -> Option<Role> {
        self.roles
            .get(authorization.and_then(bearer_token)?)
            .copied()
    }

    /// Whether the request's bearer token may call `path`.
    pub fn check(&self, path: &str, authorization: Option<&str>) -> Result<(), Status> {
        let Some(required) = required_role(path) else {
            return Ok(());
        };
        let token = authorization
            .and_then(bearer_token)
            .ok_or_else(|| Status::unauthenticated("send `authorization: Bearer <token>`"))?;
        let role = self
            .roles
            .get(token)
            .ok_or_else(|| Status::unauthenticated("unknown token"))?;
        if !role.may(required) {
            let needs = match required {
                Role::Agent => "an agent or operator",
                Role::Reader | Role::Operator => "an operator",
            };
            return Err(Status::permission_denied(format!(
                "a {} token may not call {}; it needs {needs} token",
                role.as_str(),
                path.trim_start_matches(SERVICE_PREFIX)
                    .trim_start_matches(AGENTS_PREFIX),
            )));
        }
        Ok(())
    }
}

/// The token of an `authorization` value: the scheme `Bearer` in any case (RFC 7235),
/// then one or more spaces or tabs, then the token. Whitespace around the value is not
/// part of it (RFC 9110's optional whitespace), so a trailing space or tab is ignored;
/// whitespace inside the token is not (tokens have none).
fn bearer_token(value: &str) -> Option<&str> {
    let value = value.trim_matches([' ', '\t']);
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case("bearer") || !rest.starts_with([' ', '\t']) {
        return None;
    }
    let token = rest.trim_start_matches([' ', '\t']);
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const READER: &str = "reader-token-0123456789";
    const OPERATOR: &str = "operator-token-0123456789";

    fn tokens() -> Tokens {
        Tokens::parse(&format!(
            "# tokens\nreader {READER}\n\noperator {OPERATOR}\n"
        ))
        .unwrap()
    }

    #[test]
    fn the_placeholder_tokens_shipped_in_deploy_are_refused() {
        let shipped = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("deploy/kubernetes/base/tokens.placeholder"),
        )
        .unwrap();
        let Err(error) = Tokens::parse(&shipped) else {
            panic!("the placeholder tokens were accepted");
        };
        assert!(error.contains("placeholder"), "{error}");
        assert!(Tokens::parse("operator replace-me-0123456789abcdef").is_err());
    }

    #[test]
    fn roles_follow_the_method() {
        assert_eq!(
            required_role("/coloc.v1.ColocationAdvisor/Rank"),
            Some(Role::Reader)
        );
        assert_eq!(
            required_role("/coloc.v1.ColocationAdvisor/RegisterWorkload"),
            Some(Role::Operator)
        );
        assert_eq!(
            required_role("/coloc.v1.ColocationAdvisor/PinModel"),
            Some(Role::Operator)
        );
        assert_eq!(required_role("/grpc.health.v1.Health/Check"), None);
        assert_eq!(
            required_role("/coloc.v1.ProfilingAgents/ClaimProfilingJob"),
            Some(Role::Agent)
        );
        assert_eq!(
            required_role("/coloc.v1.ProfilingAgents/ListAgents"),
            Some(Role::Reader)
        );
        // An agent may run jobs and read; never write to the advisor. Operators may do all.
        assert!(Role::Agent.may(Role::Agent) && Role::Agent.may(Role::Reader));
        assert!(!Role::Agent.may(Role::Operator) && !Role::Reader.may(Role::Agent));
        assert!(Role::Operator.may(Role::Agent));
    }

    #[test]
    fn a_reader_reads_an_operator_writes_and_others_are_refused() {
        let t = tokens();
        let rank = "/coloc.v1.ColocationAdvisor/Rank";
        let train = "/coloc.v1.ColocationAdvisor/Train";
        let bearer = |token: &str| format!("Bearer {token}");
        assert!(t.check(rank, Some(&bearer(READER))).is_ok());
        assert!(t.check(rank, Some(&bearer(OPERATOR))).is_ok());
        assert!(t.check(train, Some(&bearer(OPERATOR))).is_ok());
        assert_eq!(
            t.check(train, Some(&bearer(READER))).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            t.check(rank, None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            t.check(rank, Some(&bearer("nope-nope-nope-nope")))
                .unwrap_err()
                .code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            t.check(rank, Some(READER)).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(t.check("/grpc.health.v1.Health/Check", None).is_ok());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_surrounding_whitespace_is_ignored() {
        let t = tokens();
        let rank = "/coloc.v1.ColocationAdvisor/Rank";
        for accepted in [
            format!("bearer {READER}"),
            format!("BEARER {READER}"),
            format!("bEaReR \t {READER}"),
            format!("Bearer {READER} \t"),
        ] {
            assert!(
                t.check(rank, Some(&accepted)).is_ok(),
                "{accepted:?} refused"
            );
        }
        for refused in [
            format!("Bearer{READER}"),
            format!("Basic {READER}"),
            format!("Bearer {READER}x"),
            format!("Bearer {} {}", &READER[..4], &READER[4..]),
            "Bearer ".to_string(),
            "Bearer".to_string(),
        ] {
            assert_eq!(
                t.check(rank, Some(&refused)).unwrap_err().code(),
                tonic::Code::Unauthenticated,
                "{refused:?}"
            );
        }
    }

    #[test]
    fn malformed_token_files_are_refused_and_tokens_never_printed() {
        assert!(Tokens::parse("admin abcdefghijklmnopqrstuvwxyz").is_err());
        assert!(Tokens::parse("reader short").is_err());
        assert!(Tokens::parse("reader a b c").is_err());
        assert!(Tokens::parse("# only comments\n").is_err());
        assert!(!format!("{:?}", tokens()).contains(READER));
    }
}
