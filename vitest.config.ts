import { defineConfig } from "vitest/config"

// `npm test` runs test/**, less the end-to-end suites under test/e2e and test/chaos (whole runs across processes: slow
// on 2 cores, and slower still beside another file's work), which `npm run test:e2e` (and .ci/run) runs on its own.
const e2e = process.env.EFFECT_RL_E2E === "1"

export default defineConfig({
  test: {
    include: e2e ? ["test/e2e/**/*.test.ts", "test/chaos/**/*.test.ts"] : ["test/**/*.test.ts"],
    exclude: e2e ? [] : ["test/e2e/**", "test/chaos/**", "**/node_modules/**"],
    setupFiles: ["./test/setup.ts"],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // tfjs backends are process-global: one file per worker process keeps them apart.
    pool: "forks"
  }
})
