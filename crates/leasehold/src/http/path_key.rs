//! Lock keys from a request path, by a route pattern in axum's syntax.
//!
//! The layer's key function sees the request, not the router's parsed path
//! parameters: axum keeps those in a private extension and hands them out
//! only through its async extractors. Under `Router::route_layer` the layer
//! runs after routing, so `axum::extract::MatchedPath` (the route template,
//! with axum's default feature `matched-path`) is in the request
//! extensions, but the values still have to come from the path itself. [`PathKey`] does that parsing once, correctly: it matches
//! the path against the same pattern the route uses and percent-decodes
//! each captured segment, so `/users/a%62c` and `/users/abc` lock the same
//! key.

use http::{Method, Request};

use crate::{Error, Result};

/// Derives a lock key from the request path with a route pattern.
///
/// `route` uses axum 0.8's syntax: literal segments, `{name}` for one
/// segment, `{*name}` for the rest of the path (last only). `key` is the
/// lock key with `{name}` replaced by that capture, percent-decoded.
///
/// ```
/// use leasehold::http::PathKey;
///
/// let account = PathKey::new("/accounts/{id}/transfers", "account:{id}").unwrap();
/// assert_eq!(account.key_for("/accounts/42/transfers").as_deref(), Some("account:42"));
/// assert_eq!(account.key_for("/accounts/a%20b/transfers").as_deref(), Some("account:a b"));
/// assert_eq!(account.key_for("/accounts/42"), None); // another route: no lock
/// ```
///
/// With the layer, in axum (`route_layer`, so only requests that reached
/// this route are locked; [`with_methods`](Self::with_methods), so only the
/// method the route serves is: axum runs a route layer for every method of
/// a matched path, also for one it answers `405 Method Not Allowed`):
///
/// ```no_run
/// use axum::{body::Body, http::{Method, Request}, routing::post, Router};
/// use leasehold::http::{LeaseLayer, PathKey};
///
/// # async fn f(locks: leasehold::Locks) -> leasehold::Result<Router> {
/// let account = PathKey::new("/accounts/{id}/transfers", "account:{id}")?
///     .with_methods([Method::POST])?;
/// let layer = LeaseLayer::builder(locks)
///     .with_key(move |req: &Request<Body>| account.for_request(req))
///     .build()?;
/// Ok(Router::new()
///     .route("/accounts/{id}/transfers", post(|| async { "done" }))
///     .route_layer(layer))
/// # }
/// ```
///
/// The pattern matches the path the layer sees: inside a router mounted
/// with `Router::nest("/api", ...)`, that is the path without `/api`.
#[derive(Debug, Clone)]
pub struct PathKey {
    route: Vec<Segment>,
    key: Vec<Piece>,
    /// `None`: every method.
    methods: Option<Vec<Method>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Literal(String),
    /// One segment, captured.
    Capture(String),
    /// The rest of the path, captured (at least one segment).
    Rest(String),
}

#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    /// The index of a capture in `route`.
    Capture(usize),
}

impl PathKey {
    /// Parses `route` and the `key` template.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if `route` does not start with `/`, has an
    /// empty or repeated parameter name, a stray brace, or `{*name}` before
    /// the last segment; or if `key` is empty or names a parameter the
    /// route does not capture. A segment in axum 0.7's syntax (`:id`,
    /// `*rest`) is refused with the 0.8 spelling, as axum itself refuses it.
    pub fn new(route: &str, key: &str) -> Result<Self> {
        let route = parse_route(route)?;
        let key = parse_key(key, &route)?;
        Ok(PathKey {
            route,
            key,
            methods: None,
        })
    }

    /// Locks only requests with one of `methods` (by default every method):
    /// name the methods the route serves, so that a request axum answers
    /// `405 Method Not Allowed` takes no lock. As in axum's `get`, `GET`
    /// includes `HEAD`.
    ///
    /// ```
    /// use http::{Method, Request};
    /// use leasehold::http::PathKey;
    ///
    /// let order = PathKey::new("/orders/{id}", "order:{id}")?.with_methods([Method::POST])?;
    /// let post = Request::post("/orders/7").body(())?;
    /// let get = Request::get("/orders/7").body(())?;
    /// assert_eq!(order.for_request(&post).as_deref(), Some("order:7"));
    /// assert_eq!(order.for_request(&get), None); // no lock: axum answers 405
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if `methods` is empty (it would lock nothing).
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Result<Self> {
        let mut methods: Vec<Method> = methods.into_iter().collect();
        if methods.is_empty() {
            return Err(Error::invalid(
                "route methods",
                "must name at least one method, or leave them out to lock every method",
            ));
        }
        if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
            methods.push(Method::HEAD);
        }
        self.methods = Some(methods);
        Ok(self)
    }

    /// The lock key for `path` (without the query), or `None` if `path`
    /// does not match the route. The methods of
    /// [`with_methods`](Self::with_methods) are not checked here.
    pub fn key_for(&self, path: &str) -> Option<String> {
        let captured = self.captures(path)?;
        let mut key = String::new();
        for piece in &self.key {
            match piece {
                Piece::Text(text) => key.push_str(text),
                Piece::Capture(index) => key.push_str(&captured[*index]),
            }
        }
        Some(key)
    }

    /// [`key_for`](Self::key_for) the request's URI path, or `None` if the
    /// request's method is not one of [`with_methods`](Self::with_methods):
    /// the key function for
    /// [`LeaseLayerBuilder::with_key`](super::LeaseLayerBuilder::with_key).
    pub fn for_request<B>(&self, request: &Request<B>) -> Option<String> {
        if let Some(methods) = &self.methods {
            if !methods.contains(request.method()) {
                return None;
            }
        }
        self.key_for(request.uri().path())
    }

    /// Decoded captures by segment index (non-captures stay empty).
    fn captures(&self, path: &str) -> Option<Vec<String>> {
        let mut parts = path.strip_prefix('/')?.split('/');
        let mut captured = vec![String::new(); self.route.len()];
        for (index, segment) in self.route.iter().enumerate() {
            match segment {
                Segment::Literal(literal) => {
                    if parts.next()? != literal {
                        return None;
                    }
                }
                Segment::Capture(_) => {
                    let part = parts.next().filter(|p| !p.is_empty())?;
                    captured[index] = percent_decode(part);
                }
                Segment::Rest(_) => {
                    let rest: Vec<&str> = parts.by_ref().collect();
                    if rest.iter().all(|p| p.is_empty()) {
                        return None;
                    }
                    captured[index] = percent_decode(&rest.join("/"));
                }
            }
        }
        parts.next().is_none().then_some(captured)
    }
}

fn parse_route(route: &str) -> Result<Vec<Segment>> {
    let bad = |problem: String| Error::invalid("route pattern", problem);
    let Some(body) = route.strip_prefix('/') else {
        return Err(bad(format!("must start with '/', got {route:?}")));
    };
    let mut segments = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    let parts: Vec<&str> = body.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let segment = match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(inner) => {
                let (rest, name) = match inner.strip_prefix('*') {
                    Some(name) => (true, name),
                    None => (false, inner),
                };
                if !is_param_name(name) {
                    return Err(bad(format!(
                        "parameter names are letters, digits and '_', got {part:?} in {route:?}"
                    )));
                }
                if names.contains(&name) {
                    return Err(bad(format!(
                        "parameter {name:?} appears twice in {route:?}"
                    )));
                }
                if rest && i + 1 != parts.len() {
                    return Err(bad(format!(
                        "{part:?} must be the last segment of {route:?}"
                    )));
                }
                names.push(name);
                if rest {
                    Segment::Rest(name.to_owned())
                } else {
                    Segment::Capture(name.to_owned())
                }
            }
            None if is_v07_param(part) => {
                let name = &part[1..];
                let wanted = if part.starts_with('*') {
                    format!("{{*{name}}}")
                } else {
                    format!("{{{name}}}")
                };
                return Err(bad(format!(
                    "{part:?} is axum 0.7 syntax: axum 0.8 writes this parameter {wanted}, in {route:?}"
                )));
            }
            None if part.contains(['{', '}']) => {
                return Err(bad(format!(
                    "a parameter must be a whole segment, got {part:?} in {route:?}"
                )));
            }
            None => Segment::Literal(part.to_string()),
        };
        segments.push(segment);
    }
    Ok(segments)
}

fn parse_key(template: &str, route: &[Segment]) -> Result<Vec<Piece>> {
    let bad = |problem: String| Error::invalid("key template", problem);
    if template.is_empty() {
        return Err(bad("must not be empty".to_owned()));
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| bad(format!("unclosed '{{' in {template:?}")))?;
        let name = &rest[open + 1..open + close];
        let index = route
            .iter()
            .position(|s| matches!(s, Segment::Capture(n) | Segment::Rest(n) if n == name))
            .ok_or_else(|| {
                bad(format!(
                    "{{{name}}} is not a parameter of the route, in {template:?}"
                ))
            })?;
        pieces.push(Piece::Capture(index));
        rest = &rest[open + close + 1..];
    }
    if rest.contains('}') {
        return Err(bad(format!("stray '}}' in {template:?}")));
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(pieces)
}

/// `:id` or `*rest`: a literal to axum 0.8, which refuses it unless told
/// otherwise, so it is almost surely a 0.7 pattern.
fn is_v07_param(part: &str) -> bool {
    part.strip_prefix([':', '*']).is_some_and(is_param_name)
}

fn is_param_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Decodes `%XX` escapes, so one resource has one key however its path was
/// escaped. Bytes that do not decode to UTF-8 keep their escapes, with the
/// hex digits in upper case (again one spelling per resource).
fn percent_decode(part: &str) -> String {
    let bytes = crate::percent::percent_decode_bytes(part);
    String::from_utf8(bytes).unwrap_or_else(|e| {
        e.into_bytes()
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() && b != b'%' {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(route: &str, template: &str, path: &str) -> Option<String> {
        PathKey::new(route, template).unwrap().key_for(path)
    }

    #[test]
    fn captures_fill_the_key_template() {
        let route = "/orgs/{org}/users/{id}";
        assert_eq!(
            key(route, "user:{org}/{id}", "/orgs/acme/users/7").as_deref(),
            Some("user:acme/7")
        );
        assert_eq!(key("/jobs", "jobs", "/jobs").as_deref(), Some("jobs"));
        assert_eq!(
            key("/files/{*path}", "file:{path}", "/files/a/b.txt").as_deref(),
            Some("file:a/b.txt")
        );
    }

    #[test]
    fn other_paths_do_not_match() {
        let route = "/users/{id}";
        for path in [
            "/users",
            "/users/",
            "/users/7/",
            "/users/7/x",
            "/user/7",
            "users/7",
            "",
        ] {
            assert_eq!(key(route, "u:{id}", path), None, "{path:?}");
        }
        assert_eq!(key("/files/{*path}", "f:{path}", "/files/"), None);
    }

    #[test]
    fn escapes_give_one_key_per_resource() {
        let route = "/users/{id}";
        assert_eq!(
            key(route, "u:{id}", "/users/a%62c"),
            key(route, "u:{id}", "/users/abc")
        );
        assert_eq!(
            key(route, "u:{id}", "/users/%C3%A9").as_deref(),
            Some("u:é")
        );
        // Not UTF-8: the escapes stay, in one spelling.
        assert_eq!(key(route, "u:{id}", "/users/%ff").as_deref(), Some("u:%FF"));
        assert_eq!(
            key(route, "u:{id}", "/users/%FF"),
            key(route, "u:{id}", "/users/%ff")
        );
        // A lone '%' is kept as it is.
        assert_eq!(key(route, "u:{id}", "/users/5%").as_deref(), Some("u:5%"));
    }

    #[test]
    fn bad_patterns_are_rejected_with_the_reason() {
        let error =
            |route: &str, template: &str| PathKey::new(route, template).unwrap_err().to_string();
        assert!(error("users/{id}", "u:{id}").contains("must start with '/'"));
        assert!(error("/users/{}", "u").contains("parameter names are"));
        assert!(error("/a/{id}/b/{id}", "u:{id}").contains("appears twice"));
        assert!(error("/files/{*rest}/x", "f:{rest}").contains("must be the last segment"));
        assert!(error("/users/x{id}", "u:{id}").contains("a parameter must be a whole segment"));
        assert!(error("/users/{id}", "").contains("must not be empty"));
        assert!(error("/users/{id}", "u:{name}").contains("{name} is not a parameter"));
        assert!(error("/users/{id}", "u:{id").contains("unclosed"));
        assert!(error("/users/{id}", "u:id}").contains("stray"));
    }

    #[test]
    fn axum_07_patterns_are_refused_with_the_08_spelling() {
        let error =
            |route: &str, template: &str| PathKey::new(route, template).unwrap_err().to_string();
        let colon = error("/orders/:id", "order:{id}");
        assert!(
            colon.contains("\":id\" is axum 0.7 syntax: axum 0.8 writes this parameter {id}"),
            "{colon}"
        );
        let star = error("/files/*path", "file:{path}");
        assert!(
            star.contains("axum 0.8 writes this parameter {*path}"),
            "{star}"
        );
        // A colon inside a segment is a literal in both versions.
        assert_eq!(key("/a:b/{id}", "k:{id}", "/a:b/1").as_deref(), Some("k:1"));
    }

    #[test]
    fn with_methods_locks_only_those_methods() {
        let request = |method: Method| {
            Request::builder()
                .method(method)
                .uri("/o/1")
                .body(())
                .unwrap()
        };
        let post = PathKey::new("/o/{id}", "o:{id}").unwrap();
        assert_eq!(
            post.for_request(&request(Method::GET)).as_deref(),
            Some("o:1"),
            "default: every method"
        );
        let post = post.with_methods([Method::POST, Method::PUT]).unwrap();
        assert_eq!(
            post.for_request(&request(Method::POST)).as_deref(),
            Some("o:1")
        );
        assert_eq!(
            post.for_request(&request(Method::PUT)).as_deref(),
            Some("o:1")
        );
        assert_eq!(post.for_request(&request(Method::GET)), None);
        assert_eq!(post.for_request(&request(Method::HEAD)), None);
        let get = PathKey::new("/o/{id}", "o:{id}")
            .unwrap()
            .with_methods([Method::GET])
            .unwrap();
        assert_eq!(
            get.for_request(&request(Method::HEAD)).as_deref(),
            Some("o:1"),
            "as axum's get"
        );
        let empty = PathKey::new("/o/{id}", "o:{id}")
            .unwrap()
            .with_methods([])
            .unwrap_err();
        assert!(
            empty.to_string().contains("must name at least one method"),
            "{empty}"
        );
    }
}
