//! The routes: `POST /users`, `GET /users`, `GET /stats`.

use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use leasehold::http::FencingToken;
use serde::Deserialize;
use serde_json::json;

use crate::db::{CreateError, DataError};
use crate::AppState;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/users", get(list_users).post(create_user))
        .route("/stats", get(stats))
        .with_state(state)
}

#[derive(Deserialize)]
struct NewUser {
    username: String,
}

/// Without the lock layer (the racy baseline) there is no token; 0 passes
/// the fence check, as an unfenced write would.
async fn create_user(
    State(app): State<AppState>,
    token: Option<Extension<FencingToken>>,
    Json(new): Json<NewUser>,
) -> Response {
    let name = new.username.trim();
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-username",
            "username must be 1 to 64 characters without control characters",
        );
    }
    let token = token.map_or(0, |Extension(FencingToken(t))| t);
    match app.users.create(name, token, app.step_delay).await {
        Ok(user) => (StatusCode::CREATED, Json(user)).into_response(),
        Err(CreateError::Taken) => problem(
            StatusCode::CONFLICT,
            "username-taken",
            &format!("username {name:?} is taken"),
        ),
        Err(CreateError::Fenced) => problem(
            StatusCode::CONFLICT,
            "lease-lost",
            "a newer request holds the users lock; nothing was written",
        ),
        Err(CreateError::Db(e)) => db_error(e),
    }
}

async fn list_users(State(app): State<AppState>) -> Response {
    match app.users.list().await {
        Ok(users) => Json(users).into_response(),
        Err(e) => db_error(e),
    }
}

async fn stats(State(app): State<AppState>) -> Response {
    let users = match app.users.list().await {
        Ok(users) => users.len(),
        Err(e) => return db_error(e),
    };
    match app.users.counter().await {
        Ok(counter) => Json(json!({ "users": users, "counter": counter })).into_response(),
        Err(e) => db_error(e),
    }
}

fn db_error(e: DataError) -> Response {
    tracing::error!(error = %e, "database error");
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "database-error",
        "the users database failed",
    )
}

/// An RFC 9457 body, as the lock layer writes its own.
fn problem(status: StatusCode, kind: &str, detail: &str) -> Response {
    let body = json!({
        "type": format!("tag:users-api.example,2025:{kind}"),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, leasehold::http::problem::CONTENT_TYPE)],
        body.to_string(),
    )
        .into_response()
}
