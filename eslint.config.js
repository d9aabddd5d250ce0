// ESLint (flat config) for the report pages' scripts (harness/report/static) and the probe the browser tests add to
// them (tests/report_probe.js): the recommended rules, browser globals, and the ES2015 they are written in (each
// file one IIFE in "use strict" mode; the page's files share only window.HarnessReport). Run by .ci/run:
// `npm ci && npx eslint --max-warnings 0 harness/report/static tests`.
import js from "@eslint/js";
import globals from "globals";

export default [
  js.configs.recommended,
  {
    files: ["harness/report/static/**/*.js", "tests/**/*.js"],
    languageOptions: {
      ecmaVersion: 2015,
      sourceType: "script",
      globals: {...globals.browser},
    },
    rules: {
      "no-var": "off",
      "strict": ["error", "function"],
      "eqeqeq": ["error", "always"],
      "no-implicit-globals": "error",
      "max-len": ["error", {"code": 120}],
      "no-unused-vars": ["error", {"args": "after-used", "caughtErrors": "none"}],
    },
  },
];
