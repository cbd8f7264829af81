// A form generated from a JSON Schema: objects, arrays, enums, defaults, nullable and $ref.
// schemaForm(schema) -> { node, read() }; read() returns the arguments (unset optional fields left out)
// and throws an Error naming the field when a value cannot be read (bad JSON, not a number).
import { el } from "./dom.js";

let counter = 0;
const fieldId = () => `f${++counter}`;

function resolve(schema, root) {
  let seen = 0;
  while (schema && schema.$ref && seen++ < 32) {
    const path = schema.$ref.replace(/^#\//, "").split("/");
    let target = root;
    for (const part of path) target = target && target[part];
    schema = { ...target, ...Object.fromEntries(Object.entries(schema).filter(([k]) => k !== "$ref")) };
  }
  return schema || {};
}

// Optional[X] is anyOf [X, null]: the form shows X, left empty for null.
function unwrap(schema, root) {
  schema = resolve(schema, root);
  const options = schema.anyOf || schema.oneOf;
  if (options) {
    const real = options.map((s) => resolve(s, root)).filter((s) => s.type !== "null");
    if (real.length === 1) return { ...real[0], nullable: true, default: schema.default ?? real[0].default, description: schema.description || real[0].description, title: schema.title || real[0].title };
  }
  if (Array.isArray(schema.type)) {
    const real = schema.type.filter((t) => t !== "null");
    if (real.length === 1) return { ...schema, type: real[0], nullable: schema.type.includes("null") };
  }
  return schema;
}

function kindOf(schema) {
  if (schema.enum) return "enum";
  if (schema.const !== undefined) return "const";
  if (schema.type === "object" && schema.properties) return "object";
  if (schema.type === "array" && schema.items) return "array";
  if (["string", "integer", "number", "boolean"].includes(schema.type)) return schema.type;
  return "json"; // free-form: any JSON value
}

function label(name, schema, required, id) {
  return el("label", { for: id }, el("span.name", { text: name }), required ? el("span.req", { text: "*", title: "required" }) : null,
    schema.type ? el("span.type", { text: ` ${schema.type}` }) : null);
}

// One field: returns { node, read } where read() gives [present, value].
function field(name, rawSchema, root, required, path) {
  const schema = unwrap(rawSchema, root);
  const kind = kindOf(schema);
  const id = fieldId();
  const hint = schema.description ? el("small.hint", { text: schema.description }) : null;
  const where = path || name;
  const initial = schema.default;
  if (kind === "object") {
    const inner = objectFields(schema, root, where);
    const box = el("fieldset.object", { dataset: { field: where } }, el("legend", {}, name, required ? el("span.req", { text: "*" }) : null), hint, inner.node);
    return { node: box, read: () => { const value = inner.read(); return [required || Object.keys(value).length > 0, value]; } };
  }
  if (kind === "array") {
    return arrayField(name, schema, root, required, where, hint);
  }
  let input;
  let read;
  if (kind === "enum") {
    input = el("select", { id, dataset: { field: where } },
      required && initial === undefined ? null : el("option", { value: "", text: "(unset)" }),
      schema.enum.map((v, i) => el("option", { value: String(i), text: JSON.stringify(v), selected: initial !== undefined && JSON.stringify(initial) === JSON.stringify(v) })));
    read = () => (input.value === "" ? [false] : [true, schema.enum[Number(input.value)]]);
  } else if (kind === "const") {
    input = el("input", { id, value: JSON.stringify(schema.const), readonly: true, dataset: { field: where } });
    read = () => [required, schema.const];
  } else if (kind === "boolean") {
    input = el("select", { id, dataset: { field: where } },
      required ? null : el("option", { value: "", text: "(unset)" }),
      el("option", { value: "true", text: "true", selected: initial === true }),
      el("option", { value: "false", text: "false", selected: initial === false }));
    read = () => (input.value === "" ? [false] : [true, input.value === "true"]);
  } else if (kind === "integer" || kind === "number") {
    input = el("input", { id, type: "number", step: kind === "integer" ? "1" : "any", value: initial ?? "", min: schema.minimum, max: schema.maximum, dataset: { field: where } });
    read = () => {
      if (input.value === "") return [false];
      const value = Number(input.value);
      if (Number.isNaN(value) || (kind === "integer" && !Number.isInteger(value))) throw new Error(`${where}: not ${kind === "integer" ? "an integer" : "a number"}`);
      return [true, value];
    };
  } else if (kind === "string") {
    const long = (schema.maxLength || 0) > 200 || /code|text|content|query|body|prompt/i.test(name);
    input = el(long ? "textarea" : "input", { id, rows: long ? 3 : undefined, value: initial ?? "", placeholder: schema.examples ? String(schema.examples[0]) : "", dataset: { field: where } });
    if (long && initial !== undefined) input.value = initial;
    read = () => (input.value === "" && !required ? [false] : [true, input.value]);
  } else {
    input = el("textarea.json", { id, rows: 2, placeholder: "JSON", dataset: { field: where } });
    if (initial !== undefined) input.value = JSON.stringify(initial);
    read = () => {
      if (input.value.trim() === "") return [false];
      try { return [true, JSON.parse(input.value)]; } catch (e) { throw new Error(`${where}: not valid JSON (${e.message})`); }
    };
  }
  return { node: el("div.field", {}, label(name, schema, required, id), input, hint), read };
}

function arrayField(name, schema, root, required, where, hint) {
  const rows = [];
  const list = el("div.items");
  const add = (value) => {
    const item = field(`${name}[${rows.length}]`, value === undefined ? schema.items : { ...resolve(schema.items, root), default: value }, root, true, `${where}[${rows.length}]`);
    const entry = { item };
    const remove = el("button.small", { type: "button", text: "remove", "aria-label": `remove item of ${name}`, on: { click: () => { rows.splice(rows.indexOf(entry), 1); row.remove(); } } });
    const row = el("div.item", {}, item.node, remove);
    rows.push(entry);
    list.append(row);
  };
  for (const value of schema.default || []) add(value);
  const node = el("fieldset.array", { dataset: { field: where } }, el("legend", {}, name, required ? el("span.req", { text: "*" }) : null, el("span.type", { text: " array" })), hint, list,
    el("button.small", { type: "button", text: `add ${name} item`, on: { click: () => add() } }));
  return { node, read: () => [required || rows.length > 0, rows.map((r) => r.item.read()[1])] };
}

function objectFields(schema, root, path) {
  const required = new Set(schema.required || []);
  const fields = Object.entries(schema.properties || {}).map(([name, sub]) => [name, field(name, sub, root, required.has(name), path ? `${path}.${name}` : name)]);
  return {
    node: el("div.fields", {}, fields.map(([, f]) => f.node)),
    read: () => {
      const out = {};
      for (const [name, f] of fields) {
        const [present, value] = f.read();
        if (present) out[name] = value;
      }
      return out;
    },
  };
}

export function schemaForm(schema) {
  const root = schema || {};
  const top = resolve(root, root);
  if (top.type === "object" && !top.properties) {
    const raw = el("textarea.json", { rows: 4, placeholder: "{}", "aria-label": "arguments as JSON", dataset: { field: "(arguments)" } });
    return { node: el("div.fields", {}, el("p.muted", { text: "No properties in the schema: arguments as JSON." }), raw), read: () => (raw.value.trim() ? JSON.parse(raw.value) : {}) };
  }
  return objectFields(top, root, "");
}
