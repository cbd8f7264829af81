// Sessions opened from the workbench (kept for this tab), shared by the tools and environments pages.
import { api } from "./api.js";

const KEY = "toolfactory.sessions";

export function sessions() {
  try {
    return JSON.parse(sessionStorage.getItem(KEY) || "[]");
  } catch {
    return [];
  }
}

function save(list) {
  sessionStorage.setItem(KEY, JSON.stringify(list));
}

// POST /v1/sessions, optionally bound to an environment task; returns the session id.
export async function openSession(environment) {
  const answer = await api("/v1/sessions", { method: "POST", body: environment ? { environment } : {} });
  const label = environment ? `${answer.session} (${environment.pack}/${environment.task})` : answer.session;
  save([...sessions(), { id: answer.session, label }]);
  return answer.session;
}

export async function releaseSession(id) {
  try {
    await api(`/v1/sessions/${encodeURIComponent(id)}`, { method: "DELETE" });
  } finally {
    save(sessions().filter((s) => s.id !== id));
  }
}
