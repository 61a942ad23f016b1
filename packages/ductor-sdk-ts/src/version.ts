/** How this SDK names itself in `health` and `describe`, and its version (package.json's). */
export const SDK_NAME = "ductor-typescript";
export const SDK_VERSION = "0.1.0";
