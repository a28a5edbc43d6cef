// SkyRL cross-check on tfjs's default `cpu` backend (see skyrlGolden.ts).
import { describeAgainstSkyrl } from "./skyrlGolden.ts"

describeAgainstSkyrl("cpu")
