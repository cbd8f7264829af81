// The one way the pages talk to the server: fetch with the bearer token, JSON errors as ApiError.
const KEY = "toolfactory.token";

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

export function token() {
  return sessionStorage.getItem(KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

// Whether the server needs a token at all (a public route: a 401 in the console otherwise).
export async function tokenRequired() {
  const response = await fetch("/ui/api/auth");
  return (await response.json()).token_required;
}

export async function api(path, { method = "GET", body, raw = false } = {}) {
  const headers = {};
  const secret = token();
  if (secret) headers.Authorization = `Bearer ${secret}`;
  if (body !== undefined && !raw) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(body);
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/x-ndjson"; // a JSONL file as it is; untyped bodies get 415
  }
  const response = await fetch(path, { method, headers, body });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { text };
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    const failure = new ApiError(response.status, error.kind || `http_${response.status}`, error.message || text);
    if (response.status === 401) window.dispatchEvent(new CustomEvent("unauthorized", { detail: failure }));
    throw failure;
  }
  return data;
}
